"""The one routing decision of the cache-aware policies (`kv`, and `workflow` on top of it).

The router sends a request to the engine where it costs the fleet least, in seconds:

    cost(e) = ttft(e)      this request's predicted time to first token there: queueing behind
                           the requests decoding there, the prompt tokens sent there and not yet
                           prefilled, and its own uncached tokens, at e's learned prefill cost
            + delay(e)     the engine time its prefill takes from others: each request decoding
                           on e waits for the prefill's tokens, and so does the next to arrive
                           (its prefill's time × (decoding + 1); lower-tier tokens count at
                           the fraction of a recompute that loading them back costs)
            + evict(e)     what others will prefill again because its writes push their blocks
                           out of e's cache: the tokens it writes (uncached, and lower-tier ones
                           loaded back) × cost × the live share of e's cache (the chance that
                           an evicted block belonged to a context still in use)
            + lost(e)      what this context will prefill again because e's cache drops it
                           before it comes back: prompt × cost × the share of returning blocks
                           e lately no longer held × how many times a context comes back

with one amendment for a prefix many contexts share: where another engine holds a longer prefix
of the prompt than e, and more distinct contexts (workflows, else sessions, else requests) than
the fleet has engines built on that prefix lately, e is priced as holding it too. Such a prefix
will keep being built on: each engine copies it once and serves its share of the contexts to
come, so a copy is not a reason to keep new contexts off the engines that lack it. A prefix
fewer contexts share (a conversation's history, one workflow's context) stays where it is.

Everything follows from that sum, with no rule of its own:
- A prompt an engine holds costs little there: the cache saves its prefill once, in ttft(e).
- A prompt nobody holds much of (a new conversation, a new document) costs its whole prefill
  everywhere, so the engines differ only by load and by how full of live contexts they are:
  new contexts spread over the fleet by plain load balancing.
- A prefix every session shares (a system prompt) is priced, once more sessions than engines
  have built on it, as held everywhere (the amendment): new sessions spread by load and live
  share, and each engine copies the prefix once, instead of every new session following the
  first engine that happened to cache it.
- A follow-up whose history is cached stays with it while the queue there costs less than
  prefilling the history elsewhere, which also writes a second copy into someone's cache.
- An engine whose cache cannot keep the contexts it serves (more live sessions than fit, so
  each is evicted between its turns) is priced at what its sessions lose on every return:
  copying a shared prefix once to an engine that keeps them costs less, and new sessions go
  there, and sessions it keeps losing move, until the caches keep what they serve. Where every
  cache keeps its contexts, the term is zero; where all lose alike, it is the same everywhere.
- Siblings of a fan-out follow the first while waiting for its prefill costs less than doing
  that prefill again elsewhere: an idle engine's TTFT may tie, its engine time does not.

The live share is `LiveSet`'s blocks routed to e within its window over e's capacity in blocks:
what e's /metrics report (vLLM's `vllm:cache_config_info` names `num_gpu_blocks`), else the
most blocks its KV events showed it holding once it had to evict; an engine whose size is
unknown and that never had to evict still has room, and writing to it evicts nothing. What e
kept and how often contexts return are measured, not modelled (`Retention`: the share of a
returning prompt's blocks its engine still held, and returns per new context, lately). (Eviction
is least-recently-used; taking an evicted block to be live with the live share's probability,
as random eviction would, prices a cache filling up before it is full, not only at the edge.)

Costs that exceed the least by less than the TTFT predictor's recent relative error (the root
mean square of |measured - predicted| / the larger of the two, `TtftPredictor.relative_error`)
of the least costly engine's predicted TTFT are equal: the sum cannot tell them apart, so no
engine is clearly better, and the decision among them is plain load balancing. The band is
that share of the TTFT, not of the whole sum: the predictor is unsure of the TTFT, while the
other terms multiply measured numbers (per-token prefill cost, queue depth, live share). Scaled
by the whole sum, the band grew with those terms (a 32k-token prompt's delay and eviction are
each about its prefill) until a prefill queued ahead, known to make the TTFT half as long
again, counted as a tie. Among equal costs: the caller's preference (a workflow's homes)
first, then the engine with the fewest live blocks, the fewest requests in flight, and the most
of the prompt cached. An idle fleet fills evenly, and a prediction's noise (a millisecond or two
between engines of one kind) cannot send every new context to one engine.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from hiveroute.engines.engine import Engine
from hiveroute.kvindex.blocks import BlockKey
from hiveroute.kvindex.index import KvIndex, PrefixMatch
from hiveroute.kvindex.prefix_cache import reused_blocks
from hiveroute.routing.base import CycleState, RoutingRequest, StateKey
from hiveroute.routing.live_set import LiveSet
from hiveroute.routing.request_tokens import PREFIX_MATCH_KEY, request_block_keys
from hiveroute.routing.retention import Retention
from hiveroute.routing.sharing import SharedPrefixes
from hiveroute.routing.ttft_ledger import EngineLoad, TtftLedger

# set once the request's return (or new context) has been counted by `Retention` and the
# prefix it built on by `SharedPrefixes`
RETURN_OBSERVED_KEY: StateKey[bool] = StateKey("return_observed")
# the last block of the longest prefix of the request that some engine holds (what it builds
# on), and the request's context (see routing/sharing.py)
BUILT_ON_KEY: StateKey[tuple[BlockKey, Hashable]] = StateKey("built_on")
# every candidate's price as the deciding scorer saw it (for the decision log)
PRICES_KEY: StateKey[list[EngineCost]] = StateKey("prices")


@dataclass(frozen=True)
class EngineCost:
    """One engine's cost for one request, in its parts (seconds)."""

    engine: Engine
    cached_tokens: int  # of the prompt, held on the GPU or a lower tier (or speculatively)
    written_tokens: int  # blocks it would write into the GPU cache there
    ttft_s: float
    delay_s: float
    evict_s: float
    lost_s: float
    live_blocks: int
    load: EngineLoad  # what ttft_s was predicted against

    @property
    def total_s(self) -> float:
        return self.ttft_s + self.delay_s + self.evict_s + self.lost_s

    def rank(self, preference: int = 0) -> tuple[int, int, float, int, str]:
        """Among engines of equal cost: the caller's `preference` (lower first), then the
        emptier engine (fewer live blocks, fewer requests in flight), then the one holding
        more of the prompt."""
        return (
            preference,
            self.live_blocks,
            self.engine.load.queue_depth,
            -self.cached_tokens,
            self.engine.name,
        )


@dataclass(frozen=True)
class CachedPrompt:
    """What one engine holds of a prompt: tokens on the GPU (or speculatively there) and
    tokens only on a lower tier (loaded back at a fraction of a recompute)."""

    gpu_tokens: int = 0
    lower_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.gpu_tokens + self.lower_tokens


class RoutingCost:
    """Prices a request on each candidate engine; the router's one predictor of what a
    placement costs, shared by the `kv_ttft` scorer and workflow placement."""

    def __init__(
        self,
        ledger: TtftLedger,
        live: LiveSet,
        index: KvIndex,
        retention: Retention,
        sharing: SharedPrefixes | None = None,
    ) -> None:
        self.ledger = ledger
        self.live = live
        self.index = index
        self.retention = retention
        self.sharing = SharedPrefixes() if sharing is None else sharing

    def live_load(self, engine: Engine) -> float:
        """Live blocks routed to `engine` per block its cache holds: above 1, more contexts in
        use than it can keep (0 while its size is unknown and it never had to evict)."""
        return self._load(engine, self.live.blocks(engine.name))

    def kept(self, engine: Engine) -> float:
        """The share of a context `engine` will still hold when it comes back: what the
        returns to it found lately, and at most what fits of the live contexts routed to it
        (so a crowd moving to an engine is priced before its returns can show it)."""
        return self._kept(engine, self.live_load(engine))

    def _load(self, engine: Engine, live_blocks: int) -> float:
        capacity = engine.kv_capacity_blocks or self.index.capacity_blocks(engine.name)
        return live_blocks / capacity if capacity else 0.0

    def _kept(self, engine: Engine, load: float) -> float:
        fits = 1.0 / load if load > 1.0 else 1.0
        return min(self.retention.kept(engine.name), fits)

    def price(self, engine: Engine, n_tokens: int, cached: CachedPrompt) -> EngineCost:
        held = min(cached.tokens, n_tokens)
        lower = min(cached.lower_tokens, held)
        uncached = n_tokens - held
        written = n_tokens - (held - lower)  # lower-tier blocks come back into the GPU too
        queued = self.ledger.load(engine)
        ttft = self.ledger.predict(engine, uncached, lower, queued)
        prefill_s = self.ledger.prefill_seconds(engine, uncached, lower)
        delay = prefill_s * (queued.queue_depth + 1.0)
        token_s = self.ledger.predictor.prefill_cost(engine.name)
        live_blocks = self.live.blocks(engine.name)
        load = self._load(engine, live_blocks)
        evict = token_s * written * min(1.0, load)
        dropped = 1.0 - self._kept(engine, load)
        lost = (
            token_s * n_tokens * dropped * self.retention.returns_per_context() if dropped else 0.0
        )
        return EngineCost(engine, held, written, ttft, delay, evict, lost, live_blocks, queued)

    def with_copies(
        self,
        held: Mapping[str, CachedPrompt],
        keys: Sequence[BlockKey],
        block_size: int,
        context: Hashable,
        state: CycleState,
    ) -> dict[str, CachedPrompt]:
        """What each engine is priced as holding (the module docstring's amendment): what it
        holds, and the longest prefix another engine holds where more contexts than engines
        built on it lately. `keys` are the prompt's blocks of `block_size` tokens; `context`
        the request's (routing/sharing.py)."""
        priced = dict(held)
        most = max((c.tokens for c in held.values()), default=0)
        blocks = min(most // block_size, len(keys)) if block_size > 0 else 0
        if blocks == 0:
            return priced
        last = keys[blocks - 1]
        state[BUILT_ON_KEY] = (last, context)
        if self.sharing.contexts(last, besides=context) + 1 <= len(held):
            return priced
        prefix = blocks * block_size
        for name, c in held.items():
            if c.tokens < prefix:
                priced[name] = CachedPrompt(prefix - c.lower_tokens, c.lower_tokens)
        return priced

    def cheapest(self, costs: Sequence[EngineCost], prefer: Sequence[str] = ()) -> EngineCost:
        """The least costly engine. Costs above the least by less than the TTFT predictor's
        recent relative error of the least costly engine's predicted TTFT are equal (no clear
        benefit): among them the engines named in `prefer`, in its order, then the emptiest
        (`EngineCost.rank`)."""
        least = min(costs, key=lambda c: c.total_s)
        bound = least.total_s + least.ttft_s * self.ledger.predictor.relative_error()
        equal = [c for c in costs if c.total_s <= bound]
        order = {name: i for i, name in enumerate(prefer)}
        return min(equal, key=lambda c: c.rank(order.get(c.engine.name, len(order))))

    def request_routed(
        self,
        request: RoutingRequest,
        engine: Engine,
        state: CycleState,
        *,
        n_tokens: int,
        held: CachedPrompt,
        tokens: list[int] | None,
        block_size: int | None,
    ) -> None:
        """What every pricing scorer records of a request it sent to `engine`, one way for
        all: the ledger learns its TTFT against what its price counted (its uncached and
        lower-tier tokens, of `n_tokens`, and the load the price read), and its blocks, in
        `block_size` (None: unknown there), are live on `engine` (`routed`)."""
        lower = min(held.lower_tokens, n_tokens)
        load = priced_load(state, engine)
        self.ledger.routed(engine, n_tokens - held.tokens, state, lower, load=load)
        if tokens and block_size is not None:
            keys = request_block_keys(request, tokens, block_size)
            matches: dict[str, PrefixMatch] = state.get(PREFIX_MATCH_KEY, {})
            shared = reused_blocks(tokens, block_size)
            self.routed(engine, keys, matches, state, shared_blocks=shared)

    def routed(
        self,
        engine: Engine,
        keys: Sequence[BlockKey],
        held: Mapping[str, PrefixMatch],
        state: CycleState,
        *,
        shared_blocks: int = 0,
    ) -> None:
        """The request's blocks are live on `engine` now; `held` (engine name -> what the KV
        index said it held of them) tells whether an earlier prompt it extends was kept. A
        request is observed once, however many plugins or retries route it. `shared_blocks`:
        how many leading keys an earlier prompt had too (the live set may skip them)."""
        self.live.touch(engine.name, keys, shared_blocks=shared_blocks)
        if RETURN_OBSERVED_KEY not in state:
            state[RETURN_OBSERVED_KEY] = True
            self.retention.observe(keys, held)
            built_on = state.get(BUILT_ON_KEY)
            if built_on is not None:
                self.sharing.built_on(*built_on)
        self.retention.placed(engine.name, keys)


def priced_load(state: CycleState, engine: Engine) -> EngineLoad | None:
    """The load `engine`'s price in this cycle saw (None when no cost scorer priced it)."""
    for cost in state.get(PRICES_KEY, ()):
        if cost.engine is engine:
            return cost.load
    return None


def prices_for_log(prices: Sequence[EngineCost]) -> dict[str, dict[str, float]]:
    """Each candidate's price in its parts, in milliseconds: why the decision went as it did."""
    return {
        c.engine.name: {
            "total": round(c.total_s * 1000, 3),
            "ttft": round(c.ttft_s * 1000, 3),
            "delay": round(c.delay_s * 1000, 3),
            "evict": round(c.evict_s * 1000, 3),
            "lost": round(c.lost_s * 1000, 3),
            "cached_tokens": c.cached_tokens,
        }
        for c in prices
    }


def scores_from_costs(costs: Sequence[EngineCost], chosen: EngineCost) -> dict[str, float]:
    """Scores in [0, 1] for the policy pipeline: 1 for the chosen engine, the others by how
    close their cost comes to it (so a weighted mix with other scorers still reads them)."""
    best = max(chosen.total_s, 1e-9)
    return {
        c.engine.name: 1.0 if c is chosen else 0.99 * min(1.0, best / max(c.total_s, 1e-9))
        for c in costs
    }
