"""The prefill backlog: prompt tokens each engine has been sent and has not yet prefilled.

vLLM prefills in arrival order, so a new request's first token waits for every uncached token
routed there before it. That, not the number of requests in flight, is what a burst of long
prompts costs the next request; and requests still waiting for their first token are not yet
decoding, so they are not "queue" in the decode sense either. One backlog per router (shared
by every plugin that predicts TTFT), fed at routing and settled at the first token.

The engine works through its backlog meanwhile: an engine 300 ms into an 8k-token prefill is
nearly free, one that has just been sent it is not. Given the engine's prefill cost, the
backlog counts as drained at that rate since the engine began on what is left (when its
backlog was last empty, or its last first token came back).

Under `serve --workers` each worker routes to the same engines: given the host's load board,
a worker publishes its own backlog on each engine there and counts its siblings' too; the
engine prefills them all in one queue, so their sum drains once, from the latest start a worker
saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from hiveroute.engines.engine import Engine
from hiveroute.engines.load_board import LoadBoard
from hiveroute.routing.base import CycleState, StateKey

# (engine name, tokens) this request added to the backlog
BACKLOG_KEY: StateKey[tuple[str, int]] = StateKey("prefill_backlog_entry")


@dataclass
class _EngineBacklog:
    tokens: int = 0
    requests: int = 0
    since: float = 0.0  # when the engine began on the tokens left (clock seconds)


class PrefillBacklog:
    """Per engine: uncached prompt tokens and requests routed there, first token not yet
    back."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, board: LoadBoard | None = None
    ) -> None:
        self.clock = clock  # under workers: a clock every process shares (time.monotonic)
        self.board = board  # the host's load board under `serve --workers`, else None
        self._by_engine: dict[str, _EngineBacklog] = {}

    def of(self, engine: str) -> tuple[int, int]:
        """(tokens, requests) sent to `engine` and not yet prefilled."""
        if self.board is not None:
            tokens, requests, _ = self._with_siblings(engine, None)
            return tokens, requests
        found = self._by_engine.get(engine)
        return (found.tokens, found.requests) if found else (0, 0)

    def remaining(self, engine: str, seconds_per_token: float | None = None) -> float:
        """Tokens `engine` still has to prefill: all of them, or, given its prefill cost,
        less what it will have prefilled since it began on them."""
        if self.board is not None:
            return self._with_siblings(engine, seconds_per_token)[2]
        found = self._by_engine.get(engine)
        if found is None:
            return 0.0
        if not seconds_per_token or seconds_per_token <= 0:
            return float(found.tokens)
        done = (self.clock() - found.since) / seconds_per_token
        return max(0.0, found.tokens - done)

    def features(
        self, engine: Engine, uncached: int, seconds_per_token: float | None = None
    ) -> tuple[float, float]:
        """A TTFT predictor's inputs for a request with `uncached` tokens: the requests
        decoding there, and the tokens to prefill before its first token (the backlog
        drained at `seconds_per_token` when given)."""
        if self.board is not None:  # one read of the board for both
            _, requests, backlog = self._with_siblings(engine.name, seconds_per_token)
        else:
            _, requests = self.of(engine.name)
            backlog = self.remaining(engine.name, seconds_per_token)
        return max(0.0, engine.load.queue_depth - requests), backlog + uncached

    def _with_siblings(
        self, engine: str, seconds_per_token: float | None
    ) -> tuple[int, int, float]:
        """Under workers: (tokens, requests, tokens remaining) on `engine` of this worker's
        backlog and its siblings'. The engine prefills them all in one queue, at one rate:
        the sum drains once, from the latest moment a worker saw it begin on what it has left
        (draining each from its own start would count the engine's work once per worker)."""
        assert self.board is not None
        found = self._by_engine.get(engine)
        backlogs: list[tuple[float, float, float]] = []
        if found is not None:
            backlogs.append((found.tokens, found.requests, found.since))
        cell = self.board.cell(engine)
        if cell is not None:
            backlogs += cell.sibling_backlogs()
        tokens = sum(b[0] for b in backlogs)
        requests = sum(b[1] for b in backlogs)
        if not backlogs or not seconds_per_token or seconds_per_token <= 0:
            return int(tokens), int(requests), float(tokens)
        began = max(b[2] for b in backlogs)
        left = max(0.0, tokens - (self.clock() - began) / seconds_per_token)
        return int(tokens), int(requests), left

    def add(self, engine: str, uncached: int, state: CycleState) -> None:
        """The request was routed to `engine` with `uncached` tokens to prefill (a retry
        replaces the earlier attempt's entry)."""
        self.settle(state)
        entry = self._by_engine.get(engine)
        if entry is None:
            entry = self._by_engine[engine] = _EngineBacklog(since=self.clock())
        entry.tokens += max(0, uncached)
        entry.requests += 1
        state[BACKLOG_KEY] = (engine, max(0, uncached))
        if self.board is not None:
            self._publish(engine, entry)

    def settle(self, state: CycleState) -> None:
        """The request's prefill is over (first token, end or failure); idempotent."""
        entry = state.pop(BACKLOG_KEY, None)
        if entry is None:
            return
        name, tokens = entry
        found = self._by_engine.get(name)
        if found is not None:
            found.tokens -= tokens
            found.requests -= 1
            found.since = self.clock()  # what is left starts now, as far as we know
            if found.requests <= 0:
                del self._by_engine[name]
            if self.board is not None:
                self._publish(name, found)

    def _publish(self, engine: str, entry: _EngineBacklog) -> None:
        """This worker's backlog on `engine`, for its siblings to count (none: zeros)."""
        assert self.board is not None
        cell = self.board.cell(engine)
        if cell is None:  # not on the board (full, or the engine left): local only
            return
        if entry.requests <= 0:
            cell.publish_backlog(0, 0, 0.0)
        else:
            cell.publish_backlog(entry.tokens, entry.requests, entry.since)
