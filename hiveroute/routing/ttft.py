"""Predicting an engine's time to first token, learned online from what the gateway measures.

TTFT ≈ base + queue_depth × per_request_delay + uncached_tokens × prefill_cost
       + lower_tier_tokens × prefill_cost × lower_tier_factor

One fit of the three costs for the fleet, by recursive least squares on every engine's TTFTs
(with forgetting, so a changed load shows up within tens of requests), and one factor per
engine: engines behind one router usually serve one model on one kind of hardware, and where
they do not, a slower engine is slower at all three. An engine's factor is the forgetting mean
of log(its TTFT / the fleet's fit), each counted against the fleet's recent mean of the same
ratio (what every engine shares is the fit still learning, not the engine), shrunk towards 1 as
if the fleet had ten observations of it. An engine not measured yet is predicted as the fleet;
only before any measurement do the defaults below apply.

Why one fit: with a fit per engine, each learnt from its own few TTFTs, engines of one kind were
priced 10-50 % apart for no reason of theirs, and new contexts kept off the one priced highest.
An engine that had served only cached prompts had never measured its per-token cost, so a long
prefill there was priced at the defaults; one whose first TTFTs came at a cold start kept them.
With one worker, a chat workload sent 26 of 360 requests to one engine of four in three of three
runs (mt-s50-w050-u32). A per-token cost measured on any engine now holds for all of them, and
a factor rests on every TTFT of its engine, whatever their size.

An engine's factor also ages with every TTFT the fleet measures after its latest: one the
router stopped sending requests to drifts back to the fleet's prediction, so a few unlucky
measurements (a prefill that met a burst) cannot keep an engine idle for good, since the router
only learns from what it routes.

Blocks on a lower tier (CPU offload, LMCache) are cached but must be loaded back: they cost a
fraction of a recompute. The `kv` policy uses this object; the `workflow` policy reuses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hiveroute.routing.base import RequestOutcome, RoutingRequest

# Defaults: a mid-size model on one GPU prefills ~10k tokens/s; each request ahead adds ~20 ms.
DEFAULT_BASE_S = 0.01
DEFAULT_QUEUE_S = 0.02
DEFAULT_PREFILL_S_PER_TOKEN = 1e-4
DEFAULT_LOWER_TIER_FACTOR = 0.15
_TOKEN_SCALE = 1000.0  # features in thousands of tokens keep the fit well conditioned
FLEET_PRIOR_OBSERVATIONS = 10.0  # what the fleet's fit weighs in an engine's prediction


@dataclass(frozen=True)
class TtftEstimate:
    total_s: float
    queue_s: float
    prefill_s: float


# Three parameters (base, per request queued, per thousand tokens), kept as plain floats: the
# fit is updated after every first token and read for every engine of every decision, and numpy
# costs more per call on three numbers than the arithmetic does.
Vector = tuple[float, float, float]
Matrix = list[list[float]]


class _Fit:
    """A recursive least squares fit of the three costs, with its covariance."""

    __slots__ = ("_trace_cap", "observations", "p", "theta")

    def __init__(self, prior: Vector) -> None:
        self.theta: Vector = prior
        # prior variance: (ten times each default)², in seconds squared. RLS reads it against
        # a noise of 1 s², so on the fixed cost it starts out worth about a hundred TTFTs: the
        # fit moves slowly. A weak prior (in units of a 10 ms noise) let a few odd TTFTs swing
        # it to predictions of 200 s for 2 s prefills (benchmarks/results/ttft_fleet_fit.md).
        self.p: Matrix = [
            [(max(prior[i], 1e-3) * 10.0) ** 2 if i == j else 0.0 for j in range(3)]
            for i in range(3)
        ]
        self.observations = 0
        # the covariance's trace is capped at ten times the prior's (see `fold`)
        self._trace_cap = 10.0 * sum(self.p[i][i] for i in range(3))

    def fold(self, x: Vector, ttft_s: float, forgetting: float) -> None:
        """One RLS step towards `ttft_s` at features `x`."""
        lam = forgetting
        p, theta = self.p, self.theta
        px = [p[i][0] * x[0] + p[i][1] * x[1] + p[i][2] * x[2] for i in range(3)]
        denominator = lam + x[0] * px[0] + x[1] * px[1] + x[2] * px[2]
        gain = [v / denominator for v in px]
        residual = ttft_s - (x[0] * theta[0] + x[1] * theta[1] + x[2] * theta[2])
        updated = [theta[i] + gain[i] * residual for i in range(3)]
        # P - P x x' P / denominator, computed once per pair and mirrored: in floating point
        # the two halves drift apart, and divided by lam at every step the drift grows until P
        # is no longer positive definite and the fit diverges (seen after ~7,000 TTFTs that
        # the features explain poorly)
        updated_p = [[0.0] * 3 for _ in range(3)]
        for i in range(3):
            for j in range(i, 3):
                updated_p[i][j] = updated_p[j][i] = (p[i][j] - gain[i] * px[j]) / lam
        # forgetting inflates P along directions the data never excites (a queue always
        # empty): cap it so one odd observation cannot swing the model
        cap = self._trace_cap
        trace = updated_p[0][0] + updated_p[1][1] + updated_p[2][2]
        if trace > cap:
            updated_p = [[v * (cap / trace) for v in row] for row in updated_p]
        self.p = updated_p
        # costs are physical: never negative, and the prefill cost never collapses to zero
        self.theta = (
            max(updated[0], 0.0),
            max(updated[1], 0.0),
            max(updated[2], 1e-9 * _TOKEN_SCALE),
        )
        self.observations += 1


class _EngineRatios:
    """How an engine's TTFTs compared with the fleet's fit: the forgetting mean of their log
    ratios, and how much evidence that mean rests on."""

    __slots__ = ("last_tick", "log_ratio_sum", "observations", "weight")

    def __init__(self) -> None:
        self.log_ratio_sum = 0.0
        self.weight = 0.0  # the ratios' forgetting count: at most one window
        self.observations = 0  # every TTFT measured on the engine
        self.last_tick = 0  # the fleet's observation count at this engine's latest


class TtftPredictor:
    """The fleet's TTFT model and each engine's factor: predict before routing, observe after
    the first token."""

    def __init__(
        self,
        *,
        base_s: float = DEFAULT_BASE_S,
        queue_s_per_request: float = DEFAULT_QUEUE_S,
        prefill_s_per_token: float = DEFAULT_PREFILL_S_PER_TOKEN,
        lower_tier_factor: float = DEFAULT_LOWER_TIER_FACTOR,
        forgetting: float = 0.98,
    ) -> None:
        if min(base_s, queue_s_per_request, prefill_s_per_token, lower_tier_factor) < 0:
            raise ValueError("TTFT predictor defaults must not be negative")
        if not 0.5 < forgetting <= 1.0:
            raise ValueError("forgetting must be in (0.5, 1]")
        self._prior: Vector = (base_s, queue_s_per_request, prefill_s_per_token * _TOKEN_SCALE)
        self._fleet = _Fit(self._prior)  # the fleet's costs, fitted on every engine's TTFTs
        self.lower_tier_factor = lower_tier_factor
        self.forgetting = forgetting
        self._engines: dict[str, _EngineRatios] = {}
        # engine -> its factor, shrunk towards 1: kept, as every decision reads every engine's
        self._factors: dict[str, float] = {}
        self._tick = 0  # TTFTs measured across the fleet
        # squared relative errors of the predictions those TTFTs were measured against (each
        # |measured - predicted| / the larger of the two), with forgetting
        self._squared_error = 0.0
        self._error_weight = 0.0
        # log(measured / the fleet's fit) over every engine's TTFTs, with forgetting
        self._level_sum = 0.0
        self._level_weight = 0.0
        # the fleet's fit counts as this many observations of an engine's own ratio: after a
        # few of its own TTFTs an engine is predicted mostly from them
        self._prior_weight = FLEET_PRIOR_OBSERVATIONS

    def _engine(self, engine: str) -> _EngineRatios:
        found = self._engines.get(engine)
        if found is None:
            found = self._engines[engine] = _EngineRatios()
        return found

    def _weight(self, ratios: _EngineRatios) -> float:
        """How many observations an engine's ratio stands for: forgetting caps it at a window,
        and ages it by every TTFT the fleet measured since its latest, beyond the gap its fair
        share leaves (one in as many as there are engines)."""
        age = max(0, self._tick - ratios.last_tick - len(self._engines))
        return ratios.weight * self.forgetting**age

    def _refresh_factors(self) -> None:
        prior_weight = self._prior_weight
        factors: dict[str, float] = {}
        for name, ratios in self._engines.items():
            if ratios.weight > 0:
                w = self._weight(ratios)
                mean = ratios.log_ratio_sum / ratios.weight
                factors[name] = math.exp(w * mean / (w + prior_weight))
        self._factors = factors

    def _theta(self, engine: str) -> Vector:
        """The costs `engine` is predicted with: the fleet's, times its factor."""
        base, per_request, per_ktoken = self._fleet.theta
        factor = self._factors.get(engine, 1.0)
        return (base * factor, per_request * factor, per_ktoken * factor)

    def prefill_cost(self, engine: str) -> float:
        """Seconds per uncached prompt token on `engine` as learned so far."""
        return self._theta(engine)[2] / _TOKEN_SCALE

    def queue_cost(self, engine: str) -> float:
        """Seconds each request ahead in the queue adds."""
        return self._theta(engine)[1]

    def relative_error(self) -> float:
        """How far off the predictions were lately, as a share of the TTFT: the root mean
        square of |measured - predicted| / the larger of the two (0 until a prediction from
        measurements was measured; below 1). TTFTs vary in proportion to their size (a long
        prefill meets more of the others' work), so the error is relative."""
        if not self._error_weight:
            return 0.0
        return math.sqrt(self._squared_error / self._error_weight)

    def forget(self, engine: str) -> None:
        """The engine left the pool: its factor goes, and it no longer counts in the fair
        share by which the others' factors age."""
        self._engines.pop(engine, None)
        self._factors.pop(engine, None)

    def observations(self, engine: str) -> int:
        ratios = self._engines.get(engine)
        return ratios.observations if ratios else 0

    def estimate(
        self, engine: str, *, queue_depth: float, uncached_tokens: float, lower_tier_tokens: int = 0
    ) -> TtftEstimate:
        base, per_request, per_ktoken = self._theta(engine)
        queue_s = base + per_request * max(0.0, queue_depth)
        tokens = uncached_tokens + lower_tier_tokens * self.lower_tier_factor
        prefill_s = per_ktoken * tokens / _TOKEN_SCALE
        return TtftEstimate(queue_s + prefill_s, queue_s, prefill_s)

    def predict(
        self, engine: str, *, queue_depth: float, uncached_tokens: float, lower_tier_tokens: int = 0
    ) -> float:
        return self.estimate(
            engine,
            queue_depth=queue_depth,
            uncached_tokens=uncached_tokens,
            lower_tier_tokens=lower_tier_tokens,
        ).total_s

    def observe(
        self,
        engine: str,
        *,
        queue_depth: float,
        uncached_tokens: float,
        ttft_s: float,
        lower_tier_tokens: int = 0,
    ) -> None:
        """Fold one measured TTFT into the engine's factor and the fleet's fit."""
        if not (0.0 < ttft_s < 3600.0) or uncached_tokens < 0:
            return
        lam = self.forgetting
        ratios = self._engine(engine)
        tokens = uncached_tokens + lower_tier_tokens * self.lower_tier_factor
        x = (1.0, max(0.0, queue_depth), tokens / _TOKEN_SCALE)
        fleet = self._fleet
        if fleet.observations:  # a prediction from the defaults says nothing
            shape = x[0] * fleet.theta[0] + x[1] * fleet.theta[1] + x[2] * fleet.theta[2]
            predicted = shape * self._factors.get(engine, 1.0)
            relative = (ttft_s - predicted) / max(ttft_s, predicted)
            self._squared_error = lam * self._squared_error + relative**2
            self._error_weight = lam * self._error_weight + 1.0
            if shape > 0:
                # the engine's ratio counts against the fleet's recent ratios: what all engines
                # share (the fit still learning) is the fleet's, what is left the engine's
                ratio = math.log(ttft_s / shape)
                level = self._level_sum / self._level_weight if self._level_weight else ratio
                ratios.log_ratio_sum = lam * ratios.log_ratio_sum + (ratio - level)
                ratios.weight = lam * ratios.weight + 1.0
                self._level_sum = lam * self._level_sum + ratio
                self._level_weight = lam * self._level_weight + 1.0
        ratios.observations += 1
        self._tick += 1
        ratios.last_tick = self._tick
        self._refresh_factors()
        # the fleet's costs learn from the TTFT as the engine's factor explains it
        fleet.fold(x, ttft_s / self._factors.get(engine, 1.0), lam)


@dataclass(frozen=True)
class RoutedFeatures:
    """What a request's TTFT was predicted from when it was routed, kept (in its CycleState)
    to learn from the TTFT it then measures."""

    queue_depth: float  # requests decoding on the engine
    backlog_tokens: float  # prompt tokens routed there before it and not yet prefilled
    uncached_tokens: int  # its own tokens to prefill, as the index saw them
    lower_tier_tokens: int = 0


def learn_ttft(
    predictor: TtftPredictor,
    request: RoutingRequest,
    outcome: RequestOutcome,
    routed: RoutedFeatures | None,
) -> float | None:
    """Folds the request's measured TTFT into its engine's model; returns that TTFT, or None
    when there is nothing to learn from (not routed by the caller, failed, no first token, or
    a non-streamed response not known to be one token long, whose time is the whole
    response's).

    The engine's own usage (prompt less cached tokens) replaces the index's guess of the
    uncached tokens: the index may be a few events behind."""
    if routed is None or outcome.engine is None or not outcome.ok or outcome.ttft_s is None:
        return None
    if not request.body.get("stream") and (
        outcome.completion_tokens is None or outcome.completion_tokens > 1
    ):
        return None  # a whole answer's time is its first token's only if it had one token
    uncached = routed.uncached_tokens
    if outcome.prompt_tokens is not None and outcome.cached_tokens is not None:
        uncached = max(0, outcome.prompt_tokens - outcome.cached_tokens)
    predictor.observe(
        outcome.engine.name,
        queue_depth=routed.queue_depth,
        uncached_tokens=routed.backlog_tokens + uncached,
        lower_tier_tokens=routed.lower_tier_tokens,
        ttft_s=outcome.ttft_s,
    )
    return outcome.ttft_s
