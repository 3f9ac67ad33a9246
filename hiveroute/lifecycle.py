"""What a part with a lifetime looks like: started with the router, stopped with it (a leaf)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol


class Component(Protocol):
    """A part that runs while the router runs: an event subscriber, a keep-warm loop, discovery.

    Its dependencies come through its constructor, so `start()` takes no argument."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a component's background task and wait until it has ended (its `finally`
    blocks run before `stop` returns); None, or a task already done: nothing to cancel."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
