"""How every hiveroute process runs: its event loop (uvloop when installed), its shutdown signal
and the free ports its children listen on.

uvloop roughly halves the per-request cost of the relay and the simulator's step loop; the
standard loop still works where uvloop is missing (it is a dependency on Linux only).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import socket
from collections.abc import Coroutine
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


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` right now, for a child process whose CLI cannot take port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
