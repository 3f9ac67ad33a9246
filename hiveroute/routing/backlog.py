"""The prefill backlog: prompt tokens each engine has been sent and has not yet prefilled.

vLLM prefills in arrival order, so a new request's first token waits for every uncached token
routed there before it. That, not the number of requests in flight, is what a burst of long
prompts costs the next request; and requests still waiting for their first token are not yet
decoding, so they are not "queue" in the decode sense either. One backlog per router (shared
by every plugin that predicts TTFT), fed at routing and settled at the first token.
"""

from __future__ import annotations

from typing import Any

from hiveroute.engines.engine import Engine
from hiveroute.routing.base import CycleState, shared_service

BACKLOG_KEY = "prefill_backlog_entry"  # (engine name, tokens) this request added


class PrefillBacklog:
    """Per engine: [uncached prompt tokens, requests] routed there, first token not yet back."""

    def __init__(self) -> None:
        self._by_engine: dict[str, list[int]] = {}

    def of(self, engine: str) -> tuple[int, int]:
        """(tokens, requests) sent to `engine` and not yet prefilled."""
        found = self._by_engine.get(engine)
        return (found[0], found[1]) if found else (0, 0)

    def features(self, engine: Engine, uncached: int) -> tuple[float, int]:
        """A TTFT predictor's inputs for a request with `uncached` tokens: the requests
        decoding there, and the tokens to prefill before its first token."""
        tokens, requests = self.of(engine.name)
        return max(0.0, engine.load.queue_depth - requests), tokens + uncached

    def add(self, engine: str, uncached: int, state: CycleState) -> None:
        """The request was routed to `engine` with `uncached` tokens to prefill (a retry
        replaces the earlier attempt's entry)."""
        self.settle(state)
        entry = self._by_engine.setdefault(engine, [0, 0])
        entry[0] += max(0, uncached)
        entry[1] += 1
        state[BACKLOG_KEY] = (engine, max(0, uncached))

    def settle(self, state: CycleState) -> None:
        """The request's prefill is over (first token, end or failure); idempotent."""
        entry = state.pop(BACKLOG_KEY, None)
        if entry is None:
            return
        name, tokens = entry
        found = self._by_engine.get(name)
        if found is not None:
            found[0] -= tokens
            found[1] -= 1
            if found[1] <= 0:
                del self._by_engine[name]


def prefill_backlog(services: dict[str, Any]) -> PrefillBacklog:
    """The router's one backlog (created on first use)."""
    return shared_service(services, "prefill_backlog", PrefillBacklog)
