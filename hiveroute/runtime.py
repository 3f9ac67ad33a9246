"""How every hiveroute process runs its event loop: uvloop when it is installed.

uvloop roughly halves the per-request cost of the relay and the simulator's step loop; the
standard loop still works where uvloop is missing (it is a dependency on Linux only).
"""

from __future__ import annotations

import asyncio
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
