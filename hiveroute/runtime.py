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


def freeze_startup_objects() -> None:
    """Take what the process built to start (modules, classes, functions, the application)
    out of the cyclic garbage collector's scans: it lives as long as the process, yet every
    full collection walked it again, a pause of tens of milliseconds for every request in
    flight. Garbage made while starting is collected first; what requests make later is
    collected as before."""
    gc.collect()
    gc.freeze()


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
