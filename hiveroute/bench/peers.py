"""Other routers to compare with, each installed from PyPI into its own virtual environment
under ``~/.cache/hiveroute/peers/`` (their dependencies never touch hiveroute's)."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from hiveroute.errors import ConfigError


@dataclass(frozen=True)
class Peer:
    name: str  # target name on the command line
    package: str  # PyPI name
    version: str  # pinned, so reports are reproducible
    module: str  # `python -m MODULE` launches it
    policies: tuple[str, ...]
    default_policy: str
    log_level: str  # their spelling of "warning" differs
    # Flags as read off each package's router_args.py (and `python -m smg.launch_router --help`
    # for smg 1.13.0): --host --port --worker-urls --policy --prometheus-host --prometheus-port
    # --log-level (all default their metrics port to 29000, so we set it).


PEERS: dict[str, Peer] = {
    "sglang": Peer(
        "sglang",
        "sglang-router",
        "0.3.2",
        "sglang_router.launch_router",
        ("random", "round_robin", "cache_aware", "power_of_two"),
        "cache_aware",
        "warn",
    ),
    # SGLang's gateway as its own package (sglang-router's successor); same launcher flags.
    "smg": Peer(
        "smg",
        "smg",
        "1.13.0",
        "smg.launch_router",
        (
            "random",
            "round_robin",
            "passthrough",
            "cache_aware",
            "power_of_two",
            "least_load",
            "manual",
            "consistent_hashing",
            "prefix_hash",
        ),
        "cache_aware",
        "warn",
    ),
    "vllm-router": Peer(
        "vllm-router",
        "vllm-router",
        "0.1.17",
        "vllm_router.launch_router",
        ("random", "round_robin", "cache_aware", "power_of_two", "consistent_hash"),
        "cache_aware",
        "warning",
    ),
}


def peers_dir() -> Path:
    base = os.environ.get("HIVEROUTE_CACHE_DIR") or os.path.expanduser("~/.cache/hiveroute")
    return Path(base) / "peers"


def peer_python(peer: Peer) -> Path:
    return peers_dir() / peer.package / "bin" / "python"


async def _run(argv: list[str], log: Path, timeout_s: float) -> int:
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
        try:
            return await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return -1


async def ensure_peer(peer: Peer, log: Path, timeout_s: float = 900.0) -> Path:
    """The peer's Python, installing the pinned package into its own venv the first time."""
    python = peer_python(peer)
    module_root = peer.module.split(".")[0]
    if python.exists() and await _run([str(python), "-c", f"import {module_root}"], log, 60) == 0:
        return python
    log.parent.mkdir(parents=True, exist_ok=True)
    venv = python.parent.parent
    print(f"installing {peer.package}=={peer.version} into {venv} (once)", file=sys.stderr)
    if await _run([sys.executable, "-m", "venv", str(venv)], log, 120) != 0:
        raise ConfigError(f"cannot create a virtual environment at {venv}; see {log}")
    pip = [str(venv / "bin" / "pip"), "install", "-q", f"{peer.package}=={peer.version}"]
    if await _run(pip, log, timeout_s) != 0:
        raise ConfigError(f"pip install {peer.package}=={peer.version} failed; see {log}")
    return python


def peer_argv(
    peer: Peer, python: Path, port: int, metrics_port: int, urls: list[str], policy: str
) -> list[str]:
    return [
        str(python),
        "-m",
        peer.module,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *urls,
        "--policy",
        policy,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
        "--log-level",
        peer.log_level,
    ]
