"""Cache-aware routing plugins: the `kv` and `prefix` policies and their load guard.

- `KvTtftScorer` (policy `kv`): for each engine, the prefix the KV index says it holds, then a
  predicted TTFT: (the prompt tokens already sent there and not yet prefilled, drained at its
  learned rate, + this request's uncached tokens) × its learned prefill cost + queueing from
  its load. Ranked by that
  prediction less the value of what it holds (`cache_weight` × cached tokens × prefill cost):
  the best scores 1, engines within a tolerance of it are ordered by how much they hold.
- `ApproxPrefixScorer` (policy `prefix`): no engine events; remembers where its own decisions
  sent each prefix (a private index whose entries live for a TTL, LRU-bounded), like SGLang's
  cache_aware router, and scores the fraction of the prompt matched.
- `LoadGuardFilter`: bounded load (Mirrokni et al.): an engine whose queue would exceed
  ``ceil(load_factor × average) + slack`` is not a candidate, so no engine is chosen for its
  cache when that makes it the bottleneck.

A request leaves the engine holding most of its prefix for a shorter predicted TTFT only when
that engine's prediction is in the tail of recent TTFTs (`tail_quantile`): leaving costs the
hit and a second copy of the prefix, staying costs this request some TTFT, which matters for the
SLO only once it is among the slowest.

Reasons (CycleState["reason"], counted in hiveroute_routing_decisions_total): `kv_hit`,
`kv_ttft_tradeoff` (a shorter match won on predicted TTFT), `kv_kept` (the longest match kept
although another engine was predicted faster: its prediction is not in the tail), `kv_miss`,
`kv_new_context` (see footprint.py), `prefix_hit`,
`prefix_miss`, `load_guard` (the engine with the best match was excluded), `no_tokens`.
"""

from __future__ import annotations

from hiveroute.engines.engine import Engine
from hiveroute.kvindex.index import KvIndex, PrefixMatch
from hiveroute.kvindex.tokenizer import Tokenizer
from hiveroute.routing.base import (
    CycleState,
    Filter,
    RequestOutcome,
    RoutingRequest,
    Scorer,
    ScorerCategory,
    StateKey,
    load_bound,
)
from hiveroute.routing.footprint import (
    NEW_CONTEXT_SHARE,
    NEW_CONTEXT_SLACK,
    NEW_CONTEXT_SLACK_S,
    new_context_engine,
)
from hiveroute.routing.policy import REASON_KEY
from hiveroute.routing.request_tokens import (
    PREFIX_MATCH_KEY,
    cache_salt,
    request_block_keys,
    request_token_ids,
)
from hiveroute.routing.ttft_ledger import TtftLedger

# the engines the guard removed this cycle
GUARD_EXCLUDED_KEY: StateKey[list[Engine]] = StateKey("load_guard_excluded")
TTFT_KEY: StateKey[dict[str, float]] = StateKey("predicted_ttft")  # engine name -> seconds
# the `prefix` policy's matches in its own approximate index (apart from the KV index's)
APPROX_MATCH_KEY: StateKey[dict[str, PrefixMatch]] = StateKey("approx_prefix_match")


class LoadGuardFilter(Filter):
    """Drops engines that would become the bottleneck if this request went to them."""

    name = "load_guard"

    def __init__(self, load_factor: float = 1.5, slack: int = 2) -> None:
        if load_factor < 1.0:
            raise ValueError("load_factor must be at least 1.0")
        if slack < 0:
            raise ValueError("slack must be 0 or more")
        self.load_factor = load_factor
        self.slack = slack

    def bound(self, candidates: list[Engine]) -> int:
        """The most requests an engine may have, this one included."""
        return load_bound(candidates, self.load_factor, self.slack)

    def filter(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> list[Engine]:
        if len(candidates) <= 1:
            return candidates
        bound = self.bound(candidates)
        allowed = [e for e in candidates if e.load.queue_depth + 1 <= bound]
        if not allowed:  # cannot happen for load_factor >= 1, but never strand a request
            allowed = [min(candidates, key=lambda e: e.load.queue_depth)]
        state[GUARD_EXCLUDED_KEY] = [e for e in candidates if e not in allowed]
        return allowed


class PrefixMatcher:
    """Each engine's cached prefix of a request, from a KV index, memoised in the CycleState.

    Shared by the cache-aware scorers and by workflow placement, so a request is tokenized and
    matched once per routing cycle whichever plugins ask.
    """

    def __init__(
        self,
        index: KvIndex,
        tokenizer: Tokenizer,
        *,
        matches_key: StateKey[dict[str, PrefixMatch]] = PREFIX_MATCH_KEY,
        fixed_block_size: int | None = None,
    ) -> None:
        self.index = index
        self.tokenizer = tokenizer
        self.matches_key = matches_key
        self.fixed_block_size = fixed_block_size

    def tokens(self, request: RoutingRequest, state: CycleState) -> list[int] | None:
        return request_token_ids(request, state, self.tokenizer)

    def block_size(self, engine: Engine) -> int | None:
        if self.fixed_block_size is not None:
            return self.fixed_block_size
        return self.index.block_size(engine.name) or engine.block_size

    def match(self, request: RoutingRequest, engine: Engine, state: CycleState) -> PrefixMatch:
        """The engine's cached prefix of this request (memoised in the state)."""
        matches: dict[str, PrefixMatch] = state.setdefault(self.matches_key, {})
        found = matches.get(engine.name)
        if found is None:
            tokens = self.tokens(request, state)
            size = self.block_size(engine)
            if not tokens or size is None:
                found = PrefixMatch(block_size=size or 1)
            else:
                keys = request_block_keys(request, state, tokens, size)
                found = self.index.match(engine.name, keys, size)
            matches[engine.name] = found
        return found

    def speculate(
        self, request: RoutingRequest, engine: Engine, state: CycleState, ttl_s: float | None
    ) -> None:
        """Count the request's blocks as cached on `engine` until events confirm them."""
        tokens = self.tokens(request, state)
        if not tokens:
            return
        size = self.block_size(engine)
        if size is None:  # no event yet: the index keeps the tokens until it learns the size
            salt = cache_salt(request)
            self.index.add_speculative_tokens(engine.name, tokens, salt=salt, ttl_s=ttl_s)
        else:
            keys = request_block_keys(request, state, tokens, size)
            self.index.add_speculative(engine.name, keys, ttl_s=ttl_s)


class _CacheScorer(Scorer):
    """Shared parts: tokens in prepare, per-engine matches through a PrefixMatcher."""

    def __init__(self, matcher: PrefixMatcher) -> None:
        self.matcher = matcher
        self.index = matcher.index

    async def prepare(self, request: RoutingRequest, state: CycleState) -> None:
        self.matcher.tokens(request, state)

    def match(self, request: RoutingRequest, engine: Engine, state: CycleState) -> PrefixMatch:
        return self.matcher.match(request, engine, state)

    def guard_took_best(
        self, request: RoutingRequest, state: CycleState, best_candidate: int
    ) -> bool:
        """Whether the load guard excluded an engine holding more of the prefix."""
        excluded: list[Engine] = state.get(GUARD_EXCLUDED_KEY, [])
        return any(self.match(request, e, state).tokens > best_candidate for e in excluded)


class KvTtftScorer(_CacheScorer):
    """Scores engines by predicted TTFT from the event-fed KV index (policy `kv`).

    Engines without KV events (or before their first event) have no known block size unless
    the pool knows it; they simply show no cached prefix and compete on load.
    """

    name = "kv_ttft"
    category = ScorerCategory.BALANCE

    def __init__(
        self,
        index: KvIndex,
        tokenizer: Tokenizer,
        ledger: TtftLedger | None = None,
        *,
        speculate: bool = True,
        tolerance: float = 0.1,
        tolerance_s: float = 0.005,
        cache_weight: float = 8.0,
        new_context_share: float = NEW_CONTEXT_SHARE,
        new_context_slack: float = NEW_CONTEXT_SLACK,
        new_context_slack_s: float = NEW_CONTEXT_SLACK_S,
        tail_quantile: float | None = 0.95,
    ) -> None:
        if min(tolerance, tolerance_s, cache_weight, new_context_slack, new_context_slack_s) < 0:
            raise ValueError("tolerances, slacks and cache_weight must not be negative")
        if not 0.0 <= new_context_share <= 1.0:
            raise ValueError("new_context_share must be within [0, 1]")
        if tail_quantile is not None and not 0.0 < tail_quantile <= 1.0:
            raise ValueError("tail_quantile must be within (0, 1], or null to turn it off")
        super().__init__(PrefixMatcher(index, tokenizer))
        self.ledger = TtftLedger() if ledger is None else ledger
        self.speculative = speculate
        self.tolerance = tolerance
        self.tolerance_s = tolerance_s
        self.cache_weight = cache_weight
        # A prompt no engine holds `new_context_share` of starts a new context: it goes where
        # the fewest tokens were written lately, among engines whose predicted TTFT is within
        # `new_context_slack` x the best (+ `new_context_slack_s`) of the best.
        self.new_context_share = new_context_share
        self.new_context_slack = new_context_slack
        self.new_context_slack_s = new_context_slack_s
        # A request stays with the engine holding most of its prefix unless that engine's
        # predicted TTFT is in the tail: above the `tail_quantile` of recent TTFTs.
        self.tail_quantile = tail_quantile

    def score(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> dict[str, float]:
        tokens = self.matcher.tokens(request, state)
        n_tokens = len(tokens) if tokens else 0
        predicted: dict[str, float] = state.setdefault(TTFT_KEY, {})
        cached: dict[str, int] = {}
        for engine in candidates:
            m = self.match(request, engine, state)
            cached[engine.name] = min(m.tokens, n_tokens)
            predicted[engine.name] = self.ledger.predict(
                engine, n_tokens - cached[engine.name], min(m.lower_tokens, n_tokens)
            )
        most = max(cached.values())
        # A cached prefix is worth more than this request's TTFT: the next turn or sibling
        # finds it too, and leaving makes a second copy that evicts someone else's. So the
        # ranking counts each cached token `cache_weight` times more at its prefill cost.
        cost = {
            e.name: predicted[e.name]
            - self.cache_weight * cached[e.name] * self.ledger.predictor.prefill_cost(e.name)
            for e in candidates
        }
        lo, hi = min(cost.values()), max(cost.values())
        # predictions are estimates: among engines within the tolerance of the best, the one
        # holding more of the prefix wins
        best_ttft = min(predicted[e.name] for e in candidates)
        near = lo + self.tolerance * best_ttft + self.tolerance_s
        scores: dict[str, float] = {}
        for e in candidates:
            c = cost[e.name]
            if c <= near:
                share = cached[e.name] / most if most else 0.0
                scores[e.name] = 1.0 - 1e-3 * (1.0 - share) - 1e-6 * (c - lo) / max(near - lo, 1e-9)
            else:
                scores[e.name] = 0.99 * (hi - c) / (hi - lo)
        winner = max(candidates, key=lambda e: (scores[e.name], cached[e.name]))
        placed = new_context_engine(
            candidates,
            cost,
            predicted,
            cached,
            n_tokens,
            self.ledger.footprint,
            share=self.new_context_share,
            slack=self.new_context_slack,
            slack_s=self.new_context_slack_s,
        )
        kept = None
        if placed is None and cached[winner.name] < most and self.tail_quantile is not None:
            tail = self.ledger.recent.quantile(self.tail_quantile)  # only a tradeoff needs it
            if tail is not None:
                kept = _holder_unless_tail(candidates, cost, predicted, cached, most, tail)
        chosen = placed or kept
        if chosen is not None:
            winner = chosen
            for name, score in scores.items():
                scores[name] = min(score, 0.99)
            scores[winner.name] = 1.0
        if tokens is None:
            reason = "no_tokens"
        elif placed is not None and winner.name != min(cost, key=cost.__getitem__):
            reason = "kv_new_context"
        elif self.guard_took_best(request, state, most):
            reason = "load_guard"
        elif kept is not None:
            reason = "kv_kept"
        elif most == 0:
            reason = "kv_miss"
        elif cached[winner.name] == most:
            reason = "kv_hit"
        else:
            reason = "kv_ttft_tradeoff"
        state.setdefault(REASON_KEY, reason)
        return scores

    def on_routed(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        m = self.match(request, engine, state)
        tokens = self.matcher.tokens(request, state)
        n_tokens = len(tokens) if tokens else 0
        self.ledger.routed(engine, n_tokens - m.tokens, state, min(m.lower_tokens, n_tokens))
        if self.speculative:
            self.matcher.speculate(request, engine, state, None)

    def on_first_token(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        self.ledger.first_token(state)

    def on_completed(
        self, request: RoutingRequest, outcome: RequestOutcome, state: CycleState
    ) -> None:
        self.ledger.completed(request, outcome, state)


def _holder_unless_tail(
    candidates: list[Engine],
    cost: dict[str, float],
    predicted: dict[str, float],
    cached: dict[str, int],
    most: int,
    tail_s: float,
) -> Engine | None:
    """The engine holding the most of the prefix, when the ranking left it for a shorter
    predicted TTFT but its own prediction is not in the tail (over `tail_s`). Leaving costs
    the hit (and a second copy of the prefix); staying costs this request some TTFT, which
    matters for the SLO only once it is among the slowest."""
    holders = [e for e in candidates if cached[e.name] == most]
    holder = min(holders, key=lambda e: (cost[e.name], e.name))
    return holder if predicted[holder.name] <= tail_s else None


class ApproxPrefixScorer(_CacheScorer):
    """Where this router's own decisions sent each prefix (policy `prefix`, no engine events).

    Every routing decision inserts the request's blocks for the chosen engine into a private
    index, valid for `ttl_s` and LRU-bounded by `max_blocks`. The score is the fraction of the
    prompt matched; a load scorer beside it decides among equals and when nothing matches.
    """

    name = "prefix_affinity"
    category = ScorerCategory.AFFINITY

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        block_size: int = 16,
        ttl_s: float = 300.0,
        max_blocks: int = 200_000,
        min_match: float = 0.0,
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        if not 0.0 <= min_match <= 1.0:
            raise ValueError("min_match must be within [0, 1]")
        index = KvIndex(max_blocks=max_blocks, speculative_ttl_s=ttl_s)
        super().__init__(
            PrefixMatcher(
                index,
                tokenizer,
                matches_key=APPROX_MATCH_KEY,
                fixed_block_size=block_size,
            )
        )
        self.min_match = min_match

    def score(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> dict[str, float]:
        tokens = self.matcher.tokens(request, state)
        if not tokens:
            state.setdefault(REASON_KEY, "no_tokens")
            return {}
        fractions = {
            e.name: min(1.0, self.match(request, e, state).tokens / len(tokens)) for e in candidates
        }
        best = max(fractions.values())
        if self.guard_took_best(request, state, int(best * len(tokens))):
            state.setdefault(REASON_KEY, "load_guard")
        elif best <= self.min_match or best == 0.0:
            state.setdefault(REASON_KEY, "prefix_miss")
            return {}
        else:
            state.setdefault(REASON_KEY, "prefix_hit")
        return fractions

    def on_routed(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        self.matcher.speculate(request, engine, state, None)
