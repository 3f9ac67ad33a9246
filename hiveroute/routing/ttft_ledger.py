"""The book-keeping around a TTFT prediction, shared by every plugin that predicts (kv, workflow).

A prediction needs the engine's prefill backlog (backlog.py); a routed request adds to that
backlog; its first token settles the backlog, and its measured TTFT teaches the predictor
(ttft.py). `TtftLedger` does those steps in that order, in one place, so two plugins cannot
drift apart on them.

A ledger is a thin view: the predictor and backlog it works on are the router's shared ones,
and the per-request entries live under fixed CycleState keys. So a pipeline with two predicting
plugins counts each routed request once and learns from each TTFT once.
"""

from __future__ import annotations

from dataclasses import dataclass

from hiveroute.engines.engine import Engine
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.base import CycleState, RequestOutcome, RoutingRequest, StateKey
from hiveroute.routing.ttft import (
    RoutedFeatures,
    TtftPredictor,
    learn_ttft,
)

# RoutedFeatures of the chosen engine, for learning
ROUTED_KEY: StateKey[RoutedFeatures] = StateKey("ttft_routed")


@dataclass(frozen=True)
class EngineLoad:
    """What an engine's TTFT is predicted against: the requests decoding there and the prompt
    tokens sent there and not yet prefilled (drained at its prefill rate). A price keeps the
    load it saw, so the TTFT that follows is learned against the same load, however late the
    plugins hear where the request went (by then it counts in flight there itself)."""

    queue_depth: float
    backlog_tokens: float


class TtftLedger:
    """Predicts an engine's TTFT from its state, and keeps that state in step with routing."""

    def __init__(
        self,
        predictor: TtftPredictor | None = None,
        backlog: PrefillBacklog | None = None,
        *,
        drain_backlog: bool = True,
    ) -> None:
        self.predictor = TtftPredictor() if predictor is None else predictor
        self.backlog = PrefillBacklog() if backlog is None else backlog
        # count an engine's backlog as drained at its learned prefill rate (backlog.py)
        self.drain_backlog = drain_backlog

    def load(self, engine: Engine) -> EngineLoad:
        """`engine`'s load now, as a prediction reads it."""
        rate = self.predictor.prefill_cost(engine.name) if self.drain_backlog else None
        queue, backlog = self.backlog.features(engine, 0, rate)
        return EngineLoad(queue, backlog)

    def predict(
        self, engine: Engine, uncached: int, lower_tier_tokens: int, load: EngineLoad
    ) -> float:
        """Seconds to the first token of a request with `uncached` tokens to prefill there,
        at `load` (`load(engine)`, kept by the price that asks)."""
        return self.predictor.predict(
            engine.name,
            queue_depth=load.queue_depth,
            uncached_tokens=load.backlog_tokens + max(0, uncached),
            lower_tier_tokens=lower_tier_tokens,
        )

    def prefill_seconds(self, engine: Engine, uncached: int, lower_tier_tokens: int = 0) -> float:
        """Seconds `engine` spends prefilling a request's own uncached tokens."""
        return self.predictor.estimate(
            engine.name,
            queue_depth=0.0,
            uncached_tokens=max(0, uncached),
            lower_tier_tokens=lower_tier_tokens,
        ).prefill_s

    def routed(
        self,
        engine: Engine,
        uncached: int,
        state: CycleState,
        lower_tier_tokens: int = 0,
        *,
        load: EngineLoad | None = None,
    ) -> None:
        """The request goes to `engine` with `uncached` tokens to prefill: remember what its
        TTFT will be learned against (`load`, the engine's load when the decision priced it;
        default: now, for a caller that runs before the request counts in flight), then add it
        to the engine's backlog."""
        uncached = max(0, uncached)
        if load is None:
            load = self.load(engine)
        state[ROUTED_KEY] = RoutedFeatures(
            load.queue_depth, load.backlog_tokens, uncached, lower_tier_tokens
        )
        self.backlog.add(engine.name, uncached, state)  # replaces an earlier attempt's entry

    def first_token(self, state: CycleState) -> None:
        """The request's prefill is over: its tokens leave the backlog."""
        self.backlog.settle(state)

    def completed(
        self, request: RoutingRequest, outcome: RequestOutcome, state: CycleState
    ) -> float | None:
        """Settles the backlog (if no first token did) and learns from the measured TTFT once;
        returns that TTFT, or None when there was nothing to learn from."""
        self.backlog.settle(state)
        return learn_ttft(self.predictor, request, outcome, state.pop(ROUTED_KEY, None))
