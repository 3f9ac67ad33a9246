"""The book-keeping around a TTFT prediction, shared by every plugin that predicts (kv, workflow).

A prediction needs the engine's prefill backlog (backlog.py); a routed request adds to that
backlog and to the engine's recent cache writes (footprint.py); its first token settles the
backlog, and its measured TTFT teaches the predictor (ttft.py). `TtftLedger` does those steps in
that order, in one place, so two plugins cannot drift apart on them.

A ledger is a thin view: the predictor, backlog, footprint and record of recent TTFTs it works
on are the router's shared ones, and the per-request entries live under fixed CycleState keys.
So a pipeline with two predicting plugins counts each routed request once and learns from each
TTFT once.
"""

from __future__ import annotations

from hiveroute.engines.engine import Engine
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.base import CycleState, RequestOutcome, RoutingRequest, StateKey
from hiveroute.routing.footprint import KvFootprint
from hiveroute.routing.ttft import (
    RecentTtfts,
    RoutedFeatures,
    TtftPredictor,
    learn_ttft,
)

# RoutedFeatures of the chosen engine, for learning
ROUTED_KEY: StateKey[RoutedFeatures] = StateKey("ttft_routed")
# the engine whose footprint counts this request already
WRITTEN_KEY: StateKey[str] = StateKey("ttft_written_to")


class TtftLedger:
    """Predicts an engine's TTFT from its state, and keeps that state in step with routing."""

    def __init__(
        self,
        predictor: TtftPredictor | None = None,
        backlog: PrefillBacklog | None = None,
        footprint: KvFootprint | None = None,
        recent: RecentTtfts | None = None,
        *,
        drain_backlog: bool = True,
    ) -> None:
        # `is None`, not `or`: an empty RecentTtfts is falsy, and a shared one must be kept
        self.predictor = TtftPredictor() if predictor is None else predictor
        self.backlog = PrefillBacklog() if backlog is None else backlog
        self.footprint = KvFootprint() if footprint is None else footprint
        self.recent = RecentTtfts() if recent is None else recent
        # count an engine's backlog as drained at its learned prefill rate (backlog.py)
        self.drain_backlog = drain_backlog

    def _features(self, engine: Engine, uncached: int) -> tuple[float, float]:
        rate = self.predictor.prefill_cost(engine.name) if self.drain_backlog else None
        return self.backlog.features(engine, uncached, rate)

    def predict(self, engine: Engine, uncached: int, lower_tier_tokens: int = 0) -> float:
        """Seconds to the first token of a request with `uncached` tokens to prefill there."""
        queue, to_prefill = self._features(engine, max(0, uncached))
        return self.predictor.predict(
            engine.name,
            queue_depth=queue,
            uncached_tokens=to_prefill,
            lower_tier_tokens=lower_tier_tokens,
        )

    def routed(
        self, engine: Engine, uncached: int, state: CycleState, lower_tier_tokens: int = 0
    ) -> None:
        """The request goes to `engine` with `uncached` tokens to prefill: remember what its
        TTFT will be learned against, then add it to the engine's backlog and writes."""
        uncached = max(0, uncached)
        queue, to_prefill = self._features(engine, 0)
        state[ROUTED_KEY] = RoutedFeatures(queue, to_prefill, uncached, lower_tier_tokens)
        self.backlog.add(engine.name, uncached, state)  # replaces an earlier attempt's entry
        if state.get(WRITTEN_KEY) != engine.name:
            state[WRITTEN_KEY] = engine.name
            self.footprint.add(engine.name, uncached)

    def first_token(self, state: CycleState) -> None:
        """The request's prefill is over: its tokens leave the backlog."""
        self.backlog.settle(state)

    def completed(
        self, request: RoutingRequest, outcome: RequestOutcome, state: CycleState
    ) -> float | None:
        """Settles the backlog (if no first token did) and learns from the measured TTFT once;
        returns that TTFT, or None when there was nothing to learn from."""
        self.backlog.settle(state)
        ttft = learn_ttft(self.predictor, request, outcome, state.pop(ROUTED_KEY, None))
        if ttft is not None:
            self.recent.observe(ttft)
        return ttft
