"""How every hiveroute process runs its event loop: uvloop when it is installed.

uvloop roughly halves the per-request cost of the relay and the simulator's step loop; the
standard loop still works where uvloop is missing (it is a dependency on Linux only).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
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


async def wait_for_shutdown_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
