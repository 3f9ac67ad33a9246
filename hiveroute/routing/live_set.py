"""The live part of each engine's prefix cache: blocks the router sent there recently.

vLLM evicts least recently used blocks. Whether an eviction costs anything depends on whether
the evicted block belongs to a context that is still in use (a conversation between turns, a
workflow between tool calls) or to one that is over. The router cannot see the engine's LRU
order, but it sees every prompt it routes: a block some request touched within the last
`window_s` seconds is presumed live, an older one presumed over. One record per router, fed by
the cost model when a request is routed.

Bookkeeping only: what the live share means for a decision is `routing/cost.py`'s business.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from hiveroute.kvindex.blocks import BlockKey

# A context untouched this long is presumed over: longer than a chat user's think time or an
# agent's tool call, shorter than the minutes after which an idle session is usually gone.
DEFAULT_LIVE_WINDOW_S = 30.0


class LiveSet:
    """Per engine, the blocks touched within `window_s`, in touch order."""

    def __init__(
        self,
        window_s: float = DEFAULT_LIVE_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s <= 0:
            raise ValueError("live window must be positive")
        self.window_s = window_s
        self.clock = clock
        self._by_engine: dict[str, OrderedDict[BlockKey, float]] = {}

    def touch(self, engine: str, keys: Sequence[BlockKey]) -> None:
        """A request with these blocks was routed to `engine`: they are live there now."""
        if not keys:
            return
        blocks = self._by_engine.setdefault(engine, OrderedDict())
        now = self.clock()
        for key in keys:
            blocks[key] = now
            blocks.move_to_end(key)
        self._expire(blocks, now)

    def blocks(self, engine: str) -> int:
        """How many of `engine`'s blocks are live."""
        blocks = self._by_engine.get(engine)
        if not blocks:
            return 0
        self._expire(blocks, self.clock())
        return len(blocks)

    def forget(self, engine: str) -> None:
        """The engine left the pool or lost its cache."""
        self._by_engine.pop(engine, None)

    def _expire(self, blocks: OrderedDict[BlockKey, float], now: float) -> None:
        horizon = now - self.window_s
        while blocks:
            key, at = next(iter(blocks.items()))
            if at >= horizon:
                break
            del blocks[key]
