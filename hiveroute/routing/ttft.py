"""Predicting an engine's time to first token, learned online from what the gateway measures.

TTFT ≈ base + queue_depth × per_request_delay + uncached_tokens × prefill_cost
       + lower_tier_tokens × prefill_cost × lower_tier_factor

One model per engine, fitted by recursive least squares of relative errors (a TTFT's noise
grows with its size; with forgetting, so a slower engine or a changed load shows up within tens
of requests), and predicted through the fleet's, as a random-effects meta-analysis pools
studies (DerSimonian and Laird): at the request's features, each engine's fit predicts with a
variance its own covariance gives (the TTFTs' noise, over how much it measured near those
features); engines differ from each other by what their predictions spread beyond those
variances. An engine's prediction is its own fit
where engines differ by more than their noise, and the fleet's pooled one where they do not.
An engine not measured yet is predicted as the fleet; only before any measurement do the
defaults below apply.

Why the features matter: engines learn mostly from the requests they happened to get. One that
served an agent's few hundred tokens a hundred times and one 33k-token prefill that met a
burst knows its queueing well and its per-token cost poorly; pooled by how many TTFTs each
engine measured, its 33k-token prediction came out half a second slower than an identical busy
engine's, and new workflows kept off it (issue 22, ag-f2-c32k-g5-context). Pooled at the
request's features, an engine counts where it measured.

An engine's own measurements also age with every TTFT the fleet measures after them: one the
router stopped sending requests to drifts back to the fleet's prediction, so a few unlucky
measurements (a prefill that met a burst) cannot keep an engine of the same hardware idle for
good. Without the fleet's fit and this aging, an engine that got no request early kept the
defaults, which are slower than most real engines, and one whose first two TTFTs were slow (a
cold start) kept those: either way the router never sent it another request and starved it,
since it only learns from what it routes.

Blocks on a lower tier (CPU offload, LMCache) are cached but must be loaded back: they cost a
fraction of a recompute. The `kv` policy uses this object; the `workflow` policy reuses it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from hiveroute.routing.base import RequestOutcome, RoutingRequest

# Defaults: a mid-size model on one GPU prefills ~10k tokens/s; each request ahead adds ~20 ms.
DEFAULT_BASE_S = 0.01
DEFAULT_QUEUE_S = 0.02
DEFAULT_PREFILL_S_PER_TOKEN = 1e-4
DEFAULT_LOWER_TIER_FACTOR = 0.15
_TOKEN_SCALE = 1000.0  # features in thousands of tokens keep the fit well conditioned


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


def _vector(values: Iterable[float]) -> Vector:
    """Three floats as a Vector (a generator's, for the fits' arithmetic)."""
    a, b, c = values
    return (a, b, c)


class _EngineModel:
    __slots__ = ("last_tick", "observations", "p", "theta")

    def __init__(self, prior: Vector) -> None:
        self.theta: Vector = prior
        # prior variance: a few times each default, so a handful of observations move it
        self.p: Matrix = [
            [(max(prior[i], 1e-3) * 10.0) ** 2 if i == j else 0.0 for j in range(3)]
            for i in range(3)
        ]
        self.observations = 0
        self.last_tick = 0  # the fleet's observation count at this engine's latest


@dataclass(frozen=True, slots=True)
class _Fit:
    """A measured engine's fit as the fleet pools it: its parameters, the upper triangle of
    its covariance (in units of the TTFTs' relative noise variance), and how much of its
    evidence is left after the TTFTs the fleet measured since its latest (1 fresh, towards
    0)."""

    name: str
    theta: Vector
    p00: float
    p01: float
    p02: float
    p11: float
    p12: float
    p22: float
    freshness: float


_MIN_NOISE_VARIANCE = 1e-6  # relative: TTFTs are not measured to better than 0.1 %
_MIN_TTFT_S = 1e-3  # no TTFT is expected below a millisecond (a fit's relative weights)
_PER_REQUEST: Vector = (0.0, 1.0, 0.0)  # the features of one more request queued
_PER_KTOKEN: Vector = (0.0, 0.0, 1.0)  # the features of a thousand more tokens to prefill


def _own_share(own: Vector, fleet: Vector, share: float) -> Vector:
    """An engine's parameters: `share` of its own fit's, the rest the fleet's."""
    if share <= 0.0:
        return fleet
    rest = 1.0 - share
    return (
        share * own[0] + rest * fleet[0],
        share * own[1] + rest * fleet[1],
        share * own[2] + rest * fleet[2],
    )


class TtftPredictor:
    """Per-engine TTFT model: predict before routing, observe after the first token."""

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
        self._p0_trace = sum(_EngineModel(self._prior).p[i][i] for i in range(3))
        self.lower_tier_factor = lower_tier_factor
        self.forgetting = forgetting
        self._models: dict[str, _EngineModel] = {}
        self._tick = 0  # TTFTs measured across the fleet
        # squared relative errors of the predictions those TTFTs were measured against (each
        # |measured - predicted| / the larger of the two), with forgetting
        self._squared_error = 0.0
        self._error_weight = 0.0
        # the TTFTs' relative noise variance (s²), from each fit's relative residuals on the
        # TTFTs it had not seen yet (each over its expected size, 1 + z' P z), with
        # forgetting; one for the fleet: engines of one kind measure with one kind of noise
        self._squared_residual = 0.0
        self._residual_weight = 0.0
        self._fits: tuple[_Fit, ...] = ()  # the measured engines'
        # per engine (None: one not measured yet), its (per request queued, per 1k tokens)
        # costs as pooled: read for every engine of every decision, changed by observations
        self._unit_costs: dict[str | None, tuple[float, float]] = {}

    def _model(self, engine: str) -> _EngineModel:
        model = self._models.get(engine)
        if model is None:
            model = self._models[engine] = _EngineModel(self._prior)
        return model

    def _freshness(self, model: _EngineModel) -> float:
        """What is left of an engine's evidence: it ages by every TTFT the fleet measured since
        its latest, beyond the gap its fair share leaves (one in as many as there are
        engines)."""
        age = max(0, self._tick - model.last_tick - len(self._models))
        return self.forgetting**age

    def _noise_variance(self) -> float:
        if not self._residual_weight:
            return _MIN_NOISE_VARIANCE
        return max(self._squared_residual / self._residual_weight, _MIN_NOISE_VARIANCE)

    def _pooled(self, engine: str | None, x: Vector) -> Vector:
        """The parameters `engine` is predicted with at features `x` (None: an engine not
        measured yet): the fleet's, moved towards its own fit by `_own_share`."""
        fits = self._fits
        if len(fits) <= 1:
            return fits[0].theta if fits else self._prior
        fleet, tau2, precisions = self._pool(x)
        if tau2 > 0.0:
            for f, w in zip(fits, precisions, strict=True):
                if f.name == engine:
                    return _own_share(f.theta, fleet, w * tau2 / (1.0 + w * tau2))
        return fleet

    def _pool(self, x: Vector) -> tuple[Vector, float, list[float]]:
        """The measured fits (two or more) pooled at features `x` as a random-effects
        meta-analysis pools studies (DerSimonian and Laird): each fit's precision there is
        1 / (s² x' P x), aged; what the engines' predictions spread beyond those precisions
        is the between-engine variance tau²; the fleet's parameters are the fits' mean
        weighted by 1 / (variance + tau²). Returns them, tau² and the precisions. An engine's
        own share is tau² against its variance: engines that differ by no more than their
        noise (tau² = 0) are all predicted as the fleet; one measured well where it really
        differs, as itself."""
        fits = self._fits
        # read for every engine of every decision: one pass, plain floats
        noise = self._noise_variance()
        x0, q, t = x
        precisions = []
        total = weighted = weighted_sq = squares = 0.0
        for f in fits:
            theta = f.theta
            variance = (
                x0 * (f.p00 * x0 + 2.0 * (f.p01 * q + f.p02 * t))
                + q * (f.p11 * q + 2.0 * f.p12 * t)
                + f.p22 * t * t
            )
            w = f.freshness / (noise * max(variance, 1e-30))
            mean = theta[0] * x0 + theta[1] * q + theta[2] * t
            precisions.append(w)
            total += w
            weighted += w * mean
            weighted_sq += w * mean * mean
            squares += w * w
        if total <= 0.0:  # every fit aged to nothing: their plain mean
            n = float(len(fits))
            return _vector(sum(f.theta[i] for f in fits) / n for i in range(3)), 0.0, precisions
        spread = weighted_sq - weighted * weighted / total  # sum of w (mean - fleet mean)²
        scale = total - squares / total
        excess = spread - (len(fits) - 1)
        tau2 = excess / scale if excess > 0.0 and scale > 0.0 else 0.0
        a = b = c = weight = 0.0
        for f, w in zip(fits, precisions, strict=True):
            u = w / (1.0 + w * tau2)
            theta = f.theta
            a += u * theta[0]
            b += u * theta[1]
            c += u * theta[2]
            weight += u
        return (a / weight, b / weight, c / weight), tau2, precisions

    def _refresh_fleet(self) -> None:
        fits = []
        for name, m in self._models.items():
            if m.observations > 0:
                p = m.p
                fits.append(
                    _Fit(
                        name,
                        m.theta,
                        p[0][0],
                        p[0][1],
                        p[0][2],
                        p[1][1],
                        p[1][2],
                        p[2][2],
                        self._freshness(m),
                    )
                )
        self._fits = tuple(fits)
        costs: dict[str | None, tuple[float, float]] = {}
        if len(fits) == 1:
            only = fits[0].theta
            costs[None] = (only[1], only[2])
        elif fits:
            queue_fleet, queue_tau2, queue_w = self._pool(_PER_REQUEST)
            token_fleet, token_tau2, token_w = self._pool(_PER_KTOKEN)
            costs[None] = (queue_fleet[1], token_fleet[2])
            for f, wq, wt in zip(fits, queue_w, token_w, strict=True):
                own_q = wq * queue_tau2 / (1.0 + wq * queue_tau2)
                own_t = wt * token_tau2 / (1.0 + wt * token_tau2)
                costs[f.name] = (
                    _own_share(f.theta, queue_fleet, own_q)[1],
                    _own_share(f.theta, token_fleet, own_t)[2],
                )
        self._unit_costs = costs

    def _unit(self, engine: str) -> tuple[float, float]:
        """`engine`'s (per request queued, per thousand tokens) costs."""
        found = self._unit_costs.get(engine) or self._unit_costs.get(None)
        return found if found is not None else (self._prior[1], self._prior[2])

    def prefill_cost(self, engine: str) -> float:
        """Seconds per uncached prompt token on `engine` as learned so far."""
        return self._unit(engine)[1] / _TOKEN_SCALE

    def queue_cost(self, engine: str) -> float:
        """Seconds each request ahead in the queue adds."""
        return self._unit(engine)[0]

    def relative_error(self) -> float:
        """How far off the predictions were lately, as a share of the TTFT: the root mean
        square of |measured - predicted| / the larger of the two (0 until a prediction from
        measurements was measured; below 1). TTFTs vary in proportion to their size (a long
        prefill meets more of the others' work), so the error is relative."""
        if not self._error_weight:
            return 0.0
        return math.sqrt(self._squared_error / self._error_weight)

    def observations(self, engine: str) -> int:
        model = self._models.get(engine)
        return model.observations if model else 0

    def estimate(
        self, engine: str, *, queue_depth: float, uncached_tokens: float, lower_tier_tokens: int = 0
    ) -> TtftEstimate:
        queued = max(0.0, queue_depth)
        ktokens = (uncached_tokens + lower_tier_tokens * self.lower_tier_factor) / _TOKEN_SCALE
        base, per_request, per_ktoken = self._pooled(engine, (1.0, queued, ktokens))
        queue_s = base + per_request * queued
        prefill_s = per_ktoken * ktokens
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
        """Fold one measured TTFT into the engine's model (one RLS step)."""
        if not (0.0 < ttft_s < 3600.0) or uncached_tokens < 0:
            return
        lam = self.forgetting
        tokens = uncached_tokens + lower_tier_tokens * self.lower_tier_factor
        x = (1.0, max(0.0, queue_depth), tokens / _TOKEN_SCALE)
        if self._fits:  # a prediction from the defaults says nothing
            predicted = self.predict(
                engine,
                queue_depth=queue_depth,
                uncached_tokens=uncached_tokens,
                lower_tier_tokens=lower_tier_tokens,
            )
            relative = (ttft_s - predicted) / max(ttft_s, predicted)
            self._squared_error = lam * self._squared_error + relative**2
            self._error_weight = lam * self._error_weight + 1.0
        model = self._model(engine)
        if model.observations == 0 and self._fits:
            model.theta = self._pooled(None, x)  # start from what the fleet taught
        p, theta = model.p, model.theta
        # least squares of relative errors: a TTFT's noise grows with its size, so each is
        # weighed by 1 / its predicted size², and the noise is one relative variance
        expected = max(x[0] * theta[0] + x[1] * theta[1] + x[2] * theta[2], _MIN_TTFT_S)
        z = (x[0] / expected, x[1] / expected, x[2] / expected)
        pz = [p[i][0] * z[0] + p[i][1] * z[1] + p[i][2] * z[2] for i in range(3)]
        denominator = lam + z[0] * pz[0] + z[1] * pz[1] + z[2] * pz[2]
        gain = [v / denominator for v in pz]
        residual = ttft_s / expected - 1.0
        if model.observations:  # a fit's first residual is the fleet's, not its noise
            self._squared_residual = lam * self._squared_residual + residual**2 * lam / denominator
            self._residual_weight = lam * self._residual_weight + 1.0
        updated = [theta[i] + gain[i] * residual for i in range(3)]
        p = [[(p[i][j] - gain[i] * pz[j]) / lam for j in range(3)] for i in range(3)]
        # forgetting inflates P along directions the data never excites (a queue always
        # empty): cap it so one odd observation cannot swing the model
        cap = self._p0_trace * 10.0
        trace = p[0][0] + p[1][1] + p[2][2]
        if trace > cap:
            p = [[v * (cap / trace) for v in row] for row in p]
        model.p = p
        # costs are physical: never negative, and the prefill cost never collapses to zero
        model.theta = (
            max(updated[0], 0.0),
            max(updated[1], 0.0),
            max(updated[2], 1e-9 * _TOKEN_SCALE),
        )
        model.observations += 1
        self._tick += 1
        model.last_tick = self._tick
        self._refresh_fleet()


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
    a non-streamed response longer than one token, whose time is the whole response's).

    The engine's own usage (prompt less cached tokens) replaces the index's guess of the
    uncached tokens: the index may be a few events behind."""
    if routed is None or outcome.engine is None or not outcome.ok or outcome.ttft_s is None:
        return None
    if not request.body.get("stream") and (outcome.completion_tokens or 0) > 1:
        return None
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
