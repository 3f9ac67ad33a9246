"""Cache-aware routing plugins: the `kv` and `prefix` policies and their load guard.

- `KvTtftScorer` (policy `kv`): for each engine, the prefix the KV index says it holds, then
  what the request would cost the fleet there (routing/cost.py: its predicted TTFT, the delay
  its prefill adds to the requests decoding there, and the live blocks its writes evict); the
  cheapest engine scores 1.
- `ApproxPrefixScorer` (policy `prefix`): no engine events; remembers where its own decisions
  sent each prefix (a private index whose entries live for a TTL, LRU-bounded), like SGLang's
  cache_aware router, and scores the fraction of the prompt matched.
- `LoadGuardFilter`: bounded load (Mirrokni et al.): an engine whose queue would exceed
  ``ceil(load_factor × average) + slack`` is not a candidate, so no engine is chosen for its
  cache when that makes it the bottleneck.

Reasons (`REASON_KEY`, counted in hiveroute_routing_decisions_total): `kv_hit` (the
engine holding the most of the prompt), `kv_ttft_tradeoff` (one holding less cost the fleet
less: load or a cache full of live contexts outweighed the hit), `kv_miss` (no engine holds
any of it), `prefix_hit`, `prefix_miss`, `load_guard` (the engine with the best match was
excluded), `no_tokens`.
"""

from __future__ import annotations

from hiveroute.engines.engine import Engine
from hiveroute.kvindex.index import KvIndex, PrefixMatch
from hiveroute.kvindex.prefix_cache import reused_blocks
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
from hiveroute.routing.cost import (
    PRICES_KEY,
    CachedPrompt,
    RoutingCost,
    scores_from_costs,
)
from hiveroute.routing.live_set import LiveSet
from hiveroute.routing.policy import REASON_KEY
from hiveroute.routing.request_tokens import (
    PREFIX_MATCH_KEY,
    PromptHead,
    cache_salt,
    prompt_head,
    request_block_keys,
    request_token_ids,
    whole_prompt,
)
from hiveroute.routing.retention import Retention
from hiveroute.routing.sharing import context_of
from hiveroute.routing.ttft_ledger import TtftLedger

# the engines the guard removed this cycle
GUARD_EXCLUDED_KEY: StateKey[list[Engine]] = StateKey("load_guard_excluded")
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
            state[GUARD_EXCLUDED_KEY] = []  # not an earlier attempt's
            return candidates
        bound = self.bound(candidates)
        allowed = [e for e in candidates if e.load.queue_depth + 1 <= bound]
        if not allowed:  # queue depths count other routers' load (fractional): never strand
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
        """The whole prompt's token ids: what is done once a request is on its way."""
        return request_token_ids(request, state, self.tokenizer)

    def head(self, request: RoutingRequest, *, tokens: int = 0) -> PromptHead | None:
        """The prompt's first token ids, as far as routing needs them (request_tokens.py)."""
        return prompt_head(request, self.tokenizer, tokens=tokens)

    def prompt_length(self, request: RoutingRequest) -> int | None:
        """The prompt's tokens, estimated from its head until it is tokenized whole; None
        when it cannot be tokenized here."""
        head = self.head(request)
        return None if head is None else head.estimated_tokens

    def block_size(self, engine: Engine) -> int | None:
        if self.fixed_block_size is not None:
            return self.fixed_block_size
        return self.index.block_size(engine.name) or engine.block_size

    def match(self, request: RoutingRequest, engine: Engine, state: CycleState) -> PrefixMatch:
        """The engine's cached prefix of this request (memoised in the state). The prompt is
        tokenized whole only where the engine holds all of its head."""
        matches: dict[str, PrefixMatch] = state.setdefault(self.matches_key, {})
        found = matches.get(engine.name)
        if found is None:
            head = self.head(request)
            size = self.block_size(engine)
            found = PrefixMatch(block_size=size or 1)
            while head is not None and head.ids and size is not None:
                keys = request_block_keys(request, head.ids, size)
                shared = reused_blocks(head.ids, size)  # blocks an earlier prompt had too
                found = self.index.match(engine.name, keys, size, shared_blocks=shared)
                if head.complete or found.blocks < len(keys):
                    break
                head = whole_prompt(request, self.tokenizer)
            matches[engine.name] = found
        return found

    def priced(
        self,
        cost: RoutingCost,
        request: RoutingRequest,
        state: CycleState,
        held: dict[str, CachedPrompt],
        holder: Engine,
    ) -> dict[str, CachedPrompt]:
        """What each engine is priced as holding (`RoutingCost.with_copies`), in the blocks of
        `holder`, the engine holding the most of the prompt."""
        size = self.block_size(holder)
        most = max((c.tokens for c in held.values()), default=0)
        head = self.head(request, tokens=most + (size or 0))  # a block past the most held
        if head is None or not head.ids or size is None:
            return held
        keys = request_block_keys(request, head.ids, size)
        return cost.with_copies(held, keys, size, context_of(request), state)

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
            keys = request_block_keys(request, tokens, size)
            shared = reused_blocks(tokens, size)  # blocks an earlier prompt had too
            self.index.add_speculative(engine.name, keys, ttl_s=ttl_s, shared_blocks=shared)


def decision_memory(
    tokenizer: Tokenizer,
    *,
    matches_key: StateKey[dict[str, PrefixMatch]],
    block_size: int = 16,
    ttl_s: float = 300.0,
    max_blocks: int = 200_000,
) -> PrefixMatcher:
    """Where this router's own decisions sent each prefix, for engines that send no KV events:
    a private index whose entries live `ttl_s` (LRU-bounded), in blocks of `block_size`."""
    index = KvIndex(max_blocks=max_blocks, speculative_ttl_s=ttl_s)
    return PrefixMatcher(index, tokenizer, matches_key=matches_key, fixed_block_size=block_size)


class _CacheScorer(Scorer):
    """Shared parts: tokens in prepare, per-engine matches through a PrefixMatcher."""

    def __init__(self, matcher: PrefixMatcher) -> None:
        self.matcher = matcher
        self.index = matcher.index

    async def prepare(self, request: RoutingRequest, state: CycleState) -> None:
        self.matcher.head(request)

    def match(self, request: RoutingRequest, engine: Engine, state: CycleState) -> PrefixMatch:
        return self.matcher.match(request, engine, state)

    def guard_took_best(
        self, request: RoutingRequest, state: CycleState, best_candidate: int
    ) -> bool:
        """Whether the load guard excluded an engine holding more of the prefix."""
        excluded: list[Engine] = state.get(GUARD_EXCLUDED_KEY, [])
        return any(self.match(request, e, state).tokens > best_candidate for e in excluded)


class KvTtftScorer(_CacheScorer):
    """Sends a request where it costs the fleet least (routing/cost.py), from what the
    event-fed KV index says each engine holds (policy `kv`).

    Engines without KV events (or before their first event) have no known block size unless
    the pool knows it; they simply show no cached prefix and compete on load.
    """

    name = "kv_ttft"
    category = ScorerCategory.BALANCE

    def __init__(
        self,
        index: KvIndex,
        tokenizer: Tokenizer,
        cost: RoutingCost | None = None,
        *,
        speculate: bool = True,
    ) -> None:
        """`cost`: the router's one cost model over `index` (a fresh one alone, for a test)."""
        super().__init__(PrefixMatcher(index, tokenizer))
        if cost is None:
            cost = RoutingCost(TtftLedger(), LiveSet(), index, Retention())
        self.cost = cost
        self.ledger = cost.ledger
        self.speculative = speculate

    def cached(self, request: RoutingRequest, engine: Engine, state: CycleState) -> CachedPrompt:
        m = self.match(request, engine, state)
        return CachedPrompt(m.gpu_tokens, m.lower_tokens)

    def score(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> dict[str, float]:
        n_tokens = self.matcher.prompt_length(request)
        held = {e.name: self.cached(request, e, state) for e in candidates}
        holder = max(candidates, key=lambda e: held[e.name].tokens)
        priced = self.matcher.priced(self.cost, request, state, held, holder)
        costs = [self.cost.price(e, n_tokens or 0, priced[e.name]) for e in candidates]
        chosen = self.cost.cheapest(costs)
        state[PRICES_KEY] = costs
        most = min(held[holder.name].tokens, n_tokens or 0)
        chosen_held = min(held[chosen.engine.name].tokens, n_tokens or 0)
        if n_tokens is None:
            reason = "no_tokens"
        elif self.guard_took_best(request, state, most):
            reason = "load_guard"
        elif most == 0:
            reason = "kv_miss"
        elif chosen_held == most:
            reason = "kv_hit"
        else:
            reason = "kv_ttft_tradeoff"
        state.setdefault(REASON_KEY, reason)
        return scores_from_costs(costs, chosen)

    def on_routed(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        tokens = self.matcher.tokens(request, state)
        self.cost.request_routed(
            request,
            engine,
            state,
            n_tokens=len(tokens) if tokens else 0,
            held=self.cached(request, engine, state),
            tokens=tokens,
            block_size=self.matcher.block_size(engine),
        )
        if self.speculative:
            self.matcher.speculate(request, engine, state, None)

    def on_first_token(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        self.ledger.first_token(state)

    def on_completed(
        self, request: RoutingRequest, outcome: RequestOutcome, state: CycleState
    ) -> None:
        self.ledger.completed(request, outcome, state)


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
        super().__init__(
            decision_memory(
                tokenizer,
                matches_key=APPROX_MATCH_KEY,
                block_size=block_size,
                ttl_s=ttl_s,
                max_blocks=max_blocks,
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
