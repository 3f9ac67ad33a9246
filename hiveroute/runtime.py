"""How every hiveroute process runs: its event loop (uvloop when installed), its shutdown signal,
the free ports its children listen on and the cores it may use.

uvloop roughly halves the per-request cost of the relay and the simulator's step loop; the
standard loop still works where uvloop is missing (it is a dependency on Linux only).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import signal
import socket
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def use_fastest_event_loop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    uvloop.install()


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on the fastest event loop available."""
    use_fastest_event_loop()
    return asyncio.run(main)


# Containers the young generation may gain before the cyclic collector's young pass (Python's
# default is 700): about what 32 agentic requests in flight hold. See `freeze_startup_objects`.
SERVING_YOUNG_THRESHOLD = 20_000


def freeze_startup_objects() -> None:
    """Take what the process built to start (modules, classes, functions, the application)
    out of the cyclic garbage collector's scans, and let the young generation hold what the
    requests in flight hold.

    What the process built to start lives as long as it does, yet every full collection
    walked it again, a pause of tens of milliseconds for every request in flight. Garbage made
    while starting is collected first; what requests make later is collected as before.

    A request's objects are freed by reference counting when it ends (they form no cycles).
    Python counts the containers allocated net of those freed and runs its young pass whenever
    700 more are alive than at the last pass; a loaded router's requests in flight hold about
    600 each (lists of thousands of token ids and block keys among them), so a few more in
    flight set off a pass that walks them all, and every tenth pass the older generation too:
    11 % of a loaded router's CPU on 4,000-word agentic bodies
    (benchmarks/results/router_cpu_gc.md). The young pass now waits until the live containers
    grow by about what 32 requests in flight hold; cycles, if any, are still collected."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(SERVING_YOUNG_THRESHOLD, middle, oldest)


async def wait_for_shutdown_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def memory_dir() -> str | None:
    """A directory for files the processes of one router share: /dev/shm when there is one
    and it is writable (memory, never written back to a disk), else None (the default)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` right now, for a child process whose CLI cannot take port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


CGROUP_ROOT = Path("/sys/fs/cgroup")


def available_cores(
    *, cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")
) -> int:
    """The cores this process can use, at least 1: the CPUs it may run on (its affinity, which a
    cpuset narrows), and no more than its cgroup's CPU quota, rounded up. A container's
    `--cpus` or a Kubernetes CPU limit is such a quota: the affinity still lists every core of
    the node, and one busy process per node core would share the quota's few."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root, proc_cgroup)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def cgroup_cpu_quota(cgroup_root: Path, proc_cgroup: Path) -> float | None:
    """The CPU quota (cores) of this process's cgroup and the cgroups above it, the smallest
    that is set; None when none is, or on a host without cgroups. cgroup v2 keeps it in
    `cpu.max` ("QUOTA PERIOD" or "max PERIOD"), v1 in `cpu.cfs_quota_us` and `cpu.cfs_period_us`
    of the cpu controller's hierarchy."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2: one unified hierarchy
            base = cgroup_root
            read = _v2_quota
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own hierarchy
            base = next(
                (
                    cgroup_root / name
                    for name in (controllers, "cpu", "cpu,cpuacct")
                    if (cgroup_root / name).is_dir()
                ),
                cgroup_root / "cpu",
            )
            read = _v1_quota
        else:
            continue
        # inside a container the cgroup namespace makes its own cgroup the root ("/"); on a
        # host the path names it below the root: its limits and its ancestors' all apply
        directory = base / path.strip("/")
        while True:
            quota = read(directory)
            if quota is not None:
                quotas.append(quota)
            if directory == base or base not in directory.parents:
                break
            directory = directory.parent
    return min(quotas) if quotas else None


def _v2_quota(directory: Path) -> float | None:
    try:
        quota, _, period = (directory / "cpu.max").read_text().strip().partition(" ")
        return int(quota) / int(period) if quota != "max" and int(period) > 0 else None
    except (OSError, ValueError):
        return None


def _v1_quota(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
