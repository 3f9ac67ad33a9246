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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from hiveroute.engines.engine import Engine
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

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._by_engine: dict[str, _EngineBacklog] = {}

    def of(self, engine: str) -> tuple[int, int]:
        """(tokens, requests) sent to `engine` and not yet prefilled."""
        found = self._by_engine.get(engine)
        return (found.tokens, found.requests) if found else (0, 0)

    def remaining(self, engine: str, seconds_per_token: float | None = None) -> float:
        """Tokens `engine` still has to prefill: all of them, or, given its prefill cost,
        less what it will have prefilled since it began on them."""
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
        _, requests = self.of(engine.name)
        backlog = self.remaining(engine.name, seconds_per_token)
        return max(0.0, engine.load.queue_depth - requests), backlog + uncached

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
