"""What a part with a lifetime looks like: started with the router, stopped with it (a leaf)."""

from __future__ import annotations

from typing import Protocol


class Component(Protocol):
    """A part that runs while the router runs: an event subscriber, a keep-warm loop, discovery.

    Its dependencies come through its constructor, so `start()` takes no argument."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
