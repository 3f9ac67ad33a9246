"""The live part of each engine's prefix cache: blocks the router sent there recently.

vLLM evicts least recently used blocks. Whether an eviction costs anything depends on whether
the evicted block belongs to a context that is still in use (a conversation between turns, a
workflow between tool calls) or to one that is over. The router cannot see the engine's LRU
order, but it sees every prompt it routes: a block some request touched within the last
`window_s` seconds is presumed live, an older one presumed over. One record per router, fed by
the cost model when a request is routed.

Under `serve --workers` each worker routes a share of the requests and sees only those: given
the host's load board, a worker publishes how many blocks it counts live on each engine and
adds its siblings' counts (each taken within the window). Without them, two workers placing
new conversations at the same moment each saw the other's engine as the emptier one, and the
fleet filled unevenly (benchmarks/results/workers_routing.md, 2026-12-05). A block that
several workers routed is counted by each: the sum is at most the workers' count times the
live blocks, never fewer than any one worker sees.

Bookkeeping only: what the live share means for a decision is `routing/cost.py`'s business.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from hiveroute.engines.load_board import LoadBoard
from hiveroute.kvindex.blocks import BlockKey

# A context untouched this long is presumed over: longer than a chat user's think time or an
# agent's tool call, shorter than the minutes after which an idle session is usually gone.
DEFAULT_LIVE_WINDOW_S = 30.0


# Expired blocks are dropped at most this often (a fraction of the window): a request touches
# hundreds of blocks, so touching must be a bulk dictionary update, not per-block bookkeeping.
SWEEPS_PER_WINDOW = 16


class LiveSet:
    """Per engine, the blocks touched within `window_s` (counted to within a sixteenth of it:
    expired blocks are swept out at most every window_s / SWEEPS_PER_WINDOW)."""

    def __init__(
        self,
        window_s: float = DEFAULT_LIVE_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        board: LoadBoard | None = None,
    ) -> None:
        if window_s <= 0:
            raise ValueError("live window must be positive")
        self.window_s = window_s
        self.clock = clock  # under workers: a clock every process shares (time.monotonic)
        self.board = board  # the host's load board under `serve --workers`, else None
        self._by_engine: dict[str, dict[BlockKey, float]] = {}
        self._oldest: dict[str, float] = {}  # engine -> no block there was touched before this
        self._swept: dict[str, float] = {}  # engine -> when it was last swept

    def touch(self, engine: str, keys: Sequence[BlockKey], *, shared_blocks: int = 0) -> None:
        """A request with these blocks was routed to `engine`: they are live there now.

        `shared_blocks`: how many leading keys this prompt shares with one tokenized before.
        When the last of them was touched here within the sweep's granularity, so were all
        before it (a key names its whole prefix): only the rest are touched again, and a
        conversation's history costs its new turn, not its length."""
        if not keys:
            return
        now = self.clock()
        blocks = self._by_engine.get(engine)
        if blocks is None:
            blocks = self._by_engine[engine] = {}
            self._oldest[engine] = now
        if 0 < shared_blocks <= len(keys):
            touched = blocks.get(keys[shared_blocks - 1])
            if touched is not None and now - touched < self.window_s / SWEEPS_PER_WINDOW:
                keys = keys[shared_blocks:]
        blocks.update(dict.fromkeys(keys, now))
        self._sweep(engine, blocks, now)
        if self.board is not None:
            self._publish(engine, len(blocks), now)

    def blocks(self, engine: str) -> int:
        """How many of `engine`'s blocks are live (this worker's and its siblings')."""
        blocks = self._by_engine.get(engine)
        now = self.clock()
        if blocks:
            self._sweep(engine, blocks, now)
        own = len(blocks) if blocks else 0
        if self.board is None:
            return own
        cell = self.board.cell(engine)
        return own if cell is None else own + cell.sibling_live_blocks(now - self.window_s)

    def forget(self, engine: str) -> None:
        """The engine left the pool or lost its cache."""
        self._by_engine.pop(engine, None)
        self._oldest.pop(engine, None)
        self._swept.pop(engine, None)
        if self.board is not None:
            self._publish(engine, 0, self.clock())

    def _publish(self, engine: str, blocks: int, now: float) -> None:
        """This worker's live blocks on `engine`, for its siblings to count."""
        assert self.board is not None
        cell = self.board.cell(engine)
        if cell is not None:  # None: not on the board (full, or the engine left)
            cell.publish_live_blocks(blocks, now)

    def _sweep(self, engine: str, blocks: dict[BlockKey, float], now: float) -> None:
        horizon = now - self.window_s
        if self._oldest.get(engine, now) >= horizon:
            return  # nothing can have expired
        if now - self._swept.get(engine, -self.window_s) < self.window_s / SWEEPS_PER_WINDOW:
            return
        live = {key: at for key, at in blocks.items() if at >= horizon}
        blocks.clear()
        blocks.update(live)
        self._swept[engine] = now
        self._oldest[engine] = min(live.values(), default=now)
        if self.board is not None:
            self._publish(engine, len(blocks), now)
