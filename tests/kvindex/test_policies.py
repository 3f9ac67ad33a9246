"""The `kv` and `prefix` policies, the load guard and the TTFT predictor."""

from typing import Any

import pytest

from hiveroute.engines.engine import Engine, EngineSpec
from hiveroute.engines.pool import EnginePool
from hiveroute.errors import ConfigError
from hiveroute.kvindex.events import BlockStored
from hiveroute.kvindex.index import KvIndex
from hiveroute.kvindex.tokenizer import BuiltinTokenizer
from hiveroute.metadata import RequestMetadata
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.base import CycleState, Decision, RequestOutcome, RoutingRequest
from hiveroute.routing.cache_aware import TTFT_KEY, KvTtftScorer
from hiveroute.routing.costs import CostModel
from hiveroute.routing.footprint import KvFootprint, least_written
from hiveroute.routing.policy import Policy
from hiveroute.routing.registry import PluginContext, PluginRegistry, build_policy
from hiveroute.routing.request_tokens import PREFIX_MATCH_KEY, TOKEN_IDS_KEY
from hiveroute.routing.ttft import RecentTtfts, RoutedFeatures, TtftPredictor, learn_ttft
from hiveroute.routing.ttft_ledger import TtftLedger
from hiveroute.workflows.placement import WorkflowPlacementScorer
from tests.support.workflows import workflow_service

BS = 16
PROMPT = " ".join(f"word{i}" for i in range(200))  # ~400 tokens with the built-in tokenizer


def make(
    n: int, policy: str, *, predictor: TtftPredictor | None = None
) -> tuple[EnginePool, Policy, PluginContext]:
    pool = EnginePool([EngineSpec(f"http://127.0.0.1:{8100 + i}") for i in range(n)])
    # a stopped clock: a backlog must not drain while a slow machine runs the test
    costs = CostModel(backlog=PrefillBacklog(clock=lambda: 0.0))
    if predictor is not None:
        costs.predictor = predictor
    svc = PluginContext(pool, tokenizer=BuiltinTokenizer(), kv_index=KvIndex(), costs=costs)
    return pool, build_policy(policy, svc), svc


def request(prompt: str = PROMPT, rid: str = "r", **meta: Any) -> RoutingRequest:
    body = {"model": "m", "prompt": prompt, "stream": True}
    return RoutingRequest(rid, "/v1/completions", body, RequestMetadata(**meta))


async def route(
    policy: Policy, pool: EnginePool, req: RoutingRequest
) -> tuple[Decision, CycleState]:
    return await policy.route(req, pool.candidates("m"))


def cache_on(index: KvIndex, engine: str, tokens: list[int]) -> None:
    count = len(tokens) // BS
    hashes = list(range(1000, 1000 + count))
    index.apply(engine, BlockStored(hashes, None, tokens[: count * BS], BS))


async def test_kv_goes_where_the_prefix_is_and_shares_the_match() -> None:
    pool, policy, svc = make(3, "kv")
    tokens = BuiltinTokenizer().encode(PROMPT)
    for e in pool.engines:
        svc.kv_index.set_block_size(e.name, BS)
    cache_on(svc.kv_index, "127.0.0.1:8101", tokens)
    decision, state = await route(policy, pool, request(PROMPT + " and a new question"))
    assert decision.engine.name == "127.0.0.1:8101" and decision.reason == "kv_hit"
    assert state[TOKEN_IDS_KEY][: len(tokens)] == tokens
    matches = state[PREFIX_MATCH_KEY]
    assert matches["127.0.0.1:8101"].tokens == len(tokens) // BS * BS
    assert matches["127.0.0.1:8100"].tokens == 0


async def test_kv_without_cache_takes_the_least_loaded() -> None:
    pool, policy, _ = make(3, "kv")
    pool.engines[0].load.in_flight = 2
    pool.engines[2].load.in_flight = 1
    decision, _ = await route(policy, pool, request())
    assert decision.engine is pool.engines[1] and decision.reason == "kv_miss"


async def test_kv_trades_a_short_match_for_a_shorter_queue() -> None:
    pool, policy, svc = make(2, "kv")
    tokens = BuiltinTokenizer().encode(PROMPT)
    cache_on(svc.kv_index, "127.0.0.1:8100", tokens[:64])  # a small shared prefix
    svc.kv_index.set_block_size("127.0.0.1:8101", BS)
    pool.engines[0].load.in_flight = 4
    decision, _ = await route(policy, pool, request())
    assert decision.engine is pool.engines[1] and decision.reason == "kv_ttft_tradeoff"


async def test_near_equal_predictions_go_to_the_longer_match() -> None:
    pool, policy, svc = make(2, "kv", predictor=TtftPredictor(queue_s_per_request=0.01))
    tokens = BuiltinTokenizer().encode(PROMPT)
    cache_on(svc.kv_index, "127.0.0.1:8101", tokens[:64])  # saves a few ms at most
    svc.kv_index.set_block_size("127.0.0.1:8100", BS)
    pool.engines[1].load.in_flight = 1  # ... and costs a little queueing: a near tie
    decision, state = await route(policy, pool, request())
    predicted = state[TTFT_KEY]
    assert predicted["127.0.0.1:8101"] > predicted["127.0.0.1:8100"]
    assert decision.engine is pool.engines[1] and decision.reason == "kv_hit"


async def test_load_guard_never_makes_the_cache_holder_the_bottleneck() -> None:
    slow = TtftPredictor(prefill_s_per_token=1e-2)  # recomputing would cost seconds
    pool, policy, svc = make(4, "kv", predictor=slow)
    tokens = BuiltinTokenizer().encode(PROMPT)
    cache_on(svc.kv_index, "127.0.0.1:8100", tokens)
    pool.engines[0].load.in_flight = 3
    decision, _ = await route(policy, pool, request())
    assert decision.engine is pool.engines[0] and decision.reason == "kv_hit"  # worth the wait
    pool.engines[0].load.in_flight = 20  # kv's guard: bound = ceil(2 * 21 / 4) + 8 = 19
    decision, _ = await route(policy, pool, request())
    assert decision.engine is not pool.engines[0] and decision.reason == "load_guard"


async def test_siblings_follow_the_first_before_any_event_arrives() -> None:
    pool, policy, svc = make(4, "kv")
    for e in pool.engines:
        svc.kv_index.set_block_size(e.name, BS)
    first, _ = await route(policy, pool, request(rid="a", workflow_id="wf", agent_id="planner"))
    first.engine.load.in_flight += 1  # it is busy with the first request now
    for i in range(3):
        sibling, _ = await route(policy, pool, request(PROMPT + f" task {i}", rid=f"s{i}"))
        assert sibling.engine is first.engine and sibling.reason == "kv_hit"


async def test_kv_learns_the_prefill_cost_from_outcomes() -> None:
    pool, policy, svc = make(1, "kv")
    svc.kv_index.set_block_size(pool.engines[0].name, BS)
    predictor: TtftPredictor = svc.costs.predictor
    engine = pool.engines[0]
    for i in range(40):
        req = request(" ".join(f"w{i}x{j}" for j in range(100 + 40 * i)), rid=f"r{i}")
        _, state = await route(policy, pool, req)
        n = len(state[TOKEN_IDS_KEY])
        ttft = 0.02 + n * 5e-4  # this engine prefills at 2000 tokens/s
        outcome = RequestOutcome(engine, 200, ttft_s=ttft, prompt_tokens=n, cached_tokens=0)
        policy.on_completed(req, outcome, state)
    assert predictor.observations(engine.name) == 40
    assert predictor.prefill_cost(engine.name) == pytest.approx(5e-4, rel=0.1)


async def test_failed_or_whole_responses_do_not_teach_the_predictor() -> None:
    pool, policy, svc = make(1, "kv")
    engine = pool.engines[0]
    req = request()
    _, state = await route(policy, pool, req)
    policy.on_completed(req, RequestOutcome(engine, 502, error="down"), state)
    whole = RoutingRequest("w", "/v1/completions", {"prompt": "x"}, RequestMetadata())
    _, state2 = await route(policy, pool, whole)
    policy.on_completed(whole, RequestOutcome(engine, 200, 3.0, completion_tokens=50), state2)
    assert svc.costs.predictor.observations(engine.name) == 0


def test_learning_counts_what_the_engine_prefilled_not_what_the_index_guessed() -> None:
    engine = Engine(EngineSpec("http://127.0.0.1:8100"))
    predictor = TtftPredictor()
    req = request()
    for i in range(40):
        n = 500 + 100 * i  # the engine prefilled n tokens behind a backlog of 1000
        routed = RoutedFeatures(queue_depth=0, backlog_tokens=1000, uncached_tokens=0)
        outcome = RequestOutcome(
            engine, 200, ttft_s=0.02 + (1000 + n) * 5e-4, prompt_tokens=n + 64, cached_tokens=64
        )
        assert learn_ttft(predictor, req, outcome, routed) == outcome.ttft_s
    # had it learned from the index's guess (nothing uncached), the cost per token would be off
    assert predictor.prefill_cost(engine.name) == pytest.approx(5e-4, rel=0.1)
    not_routed = RequestOutcome(engine, 200, ttft_s=0.5, prompt_tokens=10, cached_tokens=0)
    assert learn_ttft(predictor, req, not_routed, None) is None
    assert predictor.observations(engine.name) == 40


def test_predictor_lower_tier_costs_less_than_recompute_but_not_nothing() -> None:
    p = TtftPredictor()
    cold = p.predict("e", queue_depth=0, uncached_tokens=4000)
    offloaded = p.predict("e", queue_depth=0, uncached_tokens=0, lower_tier_tokens=4000)
    warm = p.predict("e", queue_depth=0, uncached_tokens=0)
    assert warm < offloaded < cold


async def test_prefix_policy_remembers_its_own_decisions_with_a_ttl() -> None:
    pool, policy, _ = make(3, "prefix")
    first, _ = await route(policy, pool, request(rid="a"))
    assert first.reason == "prefix_miss"
    first.engine.load.in_flight += 1
    again, _ = await route(policy, pool, request(PROMPT + " more", rid="b"))
    assert again.engine is first.engine and again.reason == "prefix_hit"
    other, _ = await route(policy, pool, request("completely different text " * 20, rid="c"))
    assert other.engine is not first.engine and other.reason == "prefix_miss"
    scorer = policy.scorers[0].scorer
    scorer.index.clock = lambda: 1e12  # type: ignore[attr-defined]  # far past every TTL
    later, _ = await route(policy, pool, request(PROMPT, rid="d"))
    assert later.reason == "prefix_miss"


async def test_policies_cope_with_prompts_they_cannot_tokenize() -> None:
    pool, policy, _ = make(2, "kv")
    bad = RoutingRequest("x", "/v1/completions", {"prompt": {"no": 1}}, RequestMetadata())
    decision, _ = await route(policy, pool, bad)
    assert decision.reason == "no_tokens"
    pool, policy, _ = make(2, "prefix")
    decision, _ = await route(policy, pool, bad)
    assert decision.reason == "no_tokens"


def test_bad_plugin_parameters_are_config_errors() -> None:
    pool = EnginePool([EngineSpec("http://127.0.0.1:8100")])
    custom = {"p": {"filters": [{"name": "load_guard", "load_factor": 0.5}], "picker": "max_score"}}
    with pytest.raises(ConfigError, match="load_factor"):
        build_policy("p", PluginContext(pool), custom)
    custom = {"p": {"scorers": [{"name": "prefix_affinity", "ttl_s": 0}]}}
    with pytest.raises(ConfigError, match="ttl_s"):
        build_policy("p", PluginContext(pool), custom)


async def test_a_prefill_backlog_sends_the_next_request_elsewhere_until_its_first_token() -> None:
    pool, policy, svc = make(2, "kv")
    for e in pool.engines:
        svc.kv_index.set_block_size(e.name, BS)
    holder, other = pool.engines
    tokens = BuiltinTokenizer().encode(PROMPT)
    cache_on(svc.kv_index, holder.name, tokens[:128])  # a short cached prefix
    long_prompt = " ".join(f"fresh{i}" for i in range(3000))  # ~6k uncached tokens
    long_req = request(long_prompt, rid="long")
    state = CycleState()
    await policy.prepare(long_req, state)
    policy.on_routed(long_req, holder, state)  # in flight there, not yet prefilled
    holder.load.in_flight += 1
    scorer = policy.scorers[0].scorer
    assert isinstance(scorer, KvTtftScorer)
    assert scorer.ledger.backlog.of(holder.name)[0] > 5000

    async def decide(rid: str) -> Decision:  # choose only: no speculative entries left behind
        probe = CycleState()
        await policy.prepare(request(rid=rid), probe)
        return policy.choose(request(rid=rid), pool.candidates("m"), probe)

    decision = await decide("next")
    assert decision.engine is other and decision.reason == "kv_ttft_tradeoff"
    policy.on_first_token(long_req, holder, state)  # prefill over: now it only decodes
    assert scorer.ledger.backlog.of(holder.name) == (0, 0)
    decision = await decide("again")
    assert decision.engine is holder and decision.reason == "kv_hit"
    policy.on_completed(long_req, RequestOutcome(holder, 200, ttft_s=0.5), state)
    assert scorer.ledger.backlog.of(holder.name) == (0, 0)  # settled once, not twice
    assert len(scorer.ledger.recent) == 1  # the measured TTFT joins the recent ones (the tail rule)


async def test_a_new_context_goes_where_least_was_written_lately_unless_much_slower() -> None:
    pool, policy, svc = make(2, "kv")
    for e in pool.engines:
        svc.kv_index.set_block_size(e.name, BS)
    crowded, quiet = pool.engines
    svc.costs.footprint.add(crowded.name, 50_000)  # many sessions started there lately
    quiet.load.in_flight = 1  # a little busier this instant: the plain TTFT ranking says crowded

    async def decide(rid: str) -> Decision:
        state = CycleState()
        fresh = request(" ".join(f"{rid}{i}" for i in range(400)), rid=rid)
        await policy.prepare(fresh, state)
        return policy.choose(fresh, pool.candidates("m"), state)

    decision = await decide("new")
    assert decision.engine is quiet and decision.reason == "kv_new_context"
    quiet.load.in_flight = 500  # far slower now: the footprint no longer decides
    decision = await decide("later")
    assert decision.engine is crowded and decision.reason == "kv_miss"


def test_the_footprint_fades_with_its_half_life() -> None:
    now = [0.0]
    footprint = KvFootprint(half_life_s=10.0, clock=lambda: now[0])
    footprint.add("a", 1000)
    now[0] = 10.0
    assert footprint.of("a") == pytest.approx(500)
    footprint.add("a", 100)
    now[0] = 20.0
    assert footprint.of("a") == pytest.approx(300)
    assert footprint.of("b") == 0.0
    with pytest.raises(ValueError):
        KvFootprint(half_life_s=0)


def test_balancing_writes_never_gives_up_a_match_the_ranking_would_use() -> None:
    engines = [Engine(spec=EngineSpec(url=f"http://{n}:1")) for n in "abc"]
    a, b, c = (e.name for e in engines)
    footprint = KvFootprint()
    footprint.add(a, 90_000)  # a was written most lately, b least (none starved)
    footprint.add(b, 60_000)
    footprint.add(c, 61_000)
    cost = {a: 0.10, b: 0.11, c: 0.12}

    def pick(cached: dict[str, int], slack_s: float) -> str:
        return least_written(engines, cost, cost, cached, 1000, slack_s, footprint).name

    # a is cheapest because it holds 400 of the 1000 tokens: b and c, holding none, are not
    # offered however little was written there
    assert pick({a: 400, b: 0, c: 0}, 0.1) == a
    # a follow-up sharing a short prefix with a conversation on a: 5 % of the prompt is worth
    # keeping, however little was written on b lately
    assert pick({a: 450, b: 400, c: 400}, 0.1) == a
    # a shared prefix everyone holds: the least written within the slack wins
    assert pick({a: 400, b: 400, c: 350}, 0.1) == b
    assert pick({a: 400, b: 400, c: 400}, 0.005) == a


def test_an_engine_starved_of_new_contexts_gets_them_though_it_holds_less() -> None:
    """Sessions that share a system prompt: engines that never got a session lack it, and
    without this rule never get a session, while the others pile them up and thrash. A starved
    engine may hold up to a quarter of the prompt less than the ranking's pick."""
    engines = [Engine(spec=EngineSpec(url=f"http://{n}:1")) for n in "abcd"]
    a, b, c, d = (e.name for e in engines)
    footprint = KvFootprint()
    for name in (a, b):
        footprint.add(name, 40_000)  # sessions started here lately: they hold the prompt
    footprint.add(c, 30_000)
    shared = {a: 1024, b: 1024, c: 1024, d: 0}  # a 1k system prompt in a 9k new context
    predicted = {a: 0.60, b: 0.60, c: 0.61, d: 0.67}  # d must prefill the 1k too
    cost = {name: t - 8 * shared[name] * 7e-5 for name, t in predicted.items()}

    def pick(slack_s: float) -> str:
        return least_written(engines, cost, predicted, shared, 9000, slack_s, footprint).name

    assert pick(0.62) == d  # d, written nothing, is starved: it is offered the new context
    assert pick(0.05) == c  # too slow for this slack: the least written of the others
    footprint.add(d, 30_000)  # d is fed now: the match counts again
    assert pick(0.62) == c


async def test_kv_keeps_the_cached_prefix_unless_staying_would_be_a_tail_ttft() -> None:
    """Leaving the holder costs the hit; staying costs this request TTFT, which only matters
    for the SLO once it is among the slowest of recent TTFTs."""
    pool, policy, svc = make(2, "kv")
    holder, other = pool.engines
    tokens = BuiltinTokenizer().encode(PROMPT)
    cache_on(svc.kv_index, holder.name, tokens[:320])  # most of the prompt
    svc.kv_index.set_block_size(other.name, BS)
    holder.load.in_flight = 20  # ~0.4 s of queueing by the default predictor: a tradeoff
    scorer = policy.scorers[0].scorer
    assert isinstance(scorer, KvTtftScorer)

    async def decide(rid: str) -> Decision:
        state = CycleState()
        await policy.prepare(request(rid=rid), state)
        return policy.choose(request(rid=rid), pool.candidates("m"), state)

    decision = await decide("no-history")  # no TTFTs seen yet: the plain ranking decides
    assert decision.engine is other and decision.reason == "kv_ttft_tradeoff"
    for _ in range(100):
        scorer.ledger.recent.observe(0.5)  # recent TTFTs are slow: 0.4 s is not the tail
    decision = await decide("slow-fleet")
    assert decision.engine is holder and decision.reason == "kv_kept"
    for _ in range(512):
        scorer.ledger.recent.observe(0.05)  # a fast fleet: 0.4 s would be a tail TTFT
    decision = await decide("fast-fleet")
    assert decision.engine is other and decision.reason == "kv_ttft_tradeoff"
    with pytest.raises(ValueError, match="tail_quantile"):
        KvTtftScorer(KvIndex(), BuiltinTokenizer(), TtftLedger(), tail_quantile=1.5)


def test_recent_ttfts_quantiles_need_enough_samples() -> None:
    recent = RecentTtfts(window=100, min_samples=10, refresh=1)
    for i in range(9):
        recent.observe(0.01 * (i + 1))
    assert recent.quantile(0.5) is None
    recent.observe(0.10)
    assert recent.quantile(0.5) == pytest.approx(0.06)
    assert recent.quantile(1.0) == pytest.approx(0.10)
    recent.observe(-1.0)  # not a TTFT: ignored
    assert recent.quantile(0.0) == pytest.approx(0.01)


def test_the_backlog_drains_at_the_engines_prefill_rate_until_the_first_token() -> None:
    """An engine 0.3 s into an 8k-token prefill at 40 us/token is nearly free; one just sent
    it is not. The first token settles the request: what is left starts from then."""
    now = [100.0]
    backlog = PrefillBacklog(clock=lambda: now[0])
    first, second = CycleState(), CycleState()
    backlog.add("e", 8000, first)
    backlog.add("e", 2000, second)
    assert backlog.remaining("e") == 10_000  # without a rate: every token sent
    assert backlog.remaining("e", 4e-5) == 10_000
    now[0] += 0.3
    assert backlog.remaining("e", 4e-5) == pytest.approx(2500)
    assert backlog.remaining("e") == 10_000
    backlog.settle(first)  # its first token: the second request starts now, as far as we know
    assert backlog.remaining("e", 4e-5) == 2000
    now[0] += 1.0
    assert backlog.remaining("e", 4e-5) == 0.0  # never below nothing
    assert backlog.of("e") == (2000, 1)
    backlog.settle(second)
    assert backlog.of("e") == (0, 0) and backlog.remaining("e", 4e-5) == 0.0


async def test_two_predicting_scorers_in_one_policy_count_a_request_once() -> None:
    """`kv_ttft` and `workflow_placement` share the router's backlog, footprint and predictor
    through their ledgers: one routed request is one backlog entry, one footprint write and
    one observation, however many plugins see it."""
    custom = {"both": {"scorers": [{"name": "kv_ttft"}, {"name": "workflow_placement"}]}}
    pool = EnginePool([EngineSpec(f"http://127.0.0.1:{8100 + i}") for i in range(2)])
    svc = PluginContext(pool, tokenizer=BuiltinTokenizer(), kv_index=KvIndex())
    plugins = PluginRegistry()
    workflows = workflow_service(pool)
    plugins.register(
        "workflow_placement", lambda ctx, **kw: WorkflowPlacementScorer(ctx, workflows, **kw)
    )
    policy = build_policy("both", svc, custom, plugins)
    req = request()
    decision, state = await route(policy, pool, req)
    engine = decision.engine
    n_tokens = len(BuiltinTokenizer().encode(PROMPT))
    assert svc.costs.backlog.of(engine.name) == (n_tokens, 1)
    assert svc.costs.footprint.of(engine.name) == pytest.approx(n_tokens, rel=0.01)
    policy.on_completed(req, RequestOutcome(engine, 200, ttft_s=0.05), state)
    assert svc.costs.backlog.of(engine.name) == (0, 0)
    assert svc.costs.predictor.observations(engine.name) == 1
    assert len(svc.costs.recent) == 1


def test_a_ledger_counts_a_retry_on_another_engine_but_learns_once() -> None:
    ledger = TtftLedger()
    first, second = (Engine(EngineSpec(f"http://127.0.0.1:{8100 + i}")) for i in range(2))
    state = CycleState()
    ledger.routed(first, 1000, state)
    ledger.routed(first, 1000, state)  # a second plugin on the same decision
    assert ledger.backlog.of(first.name) == (1000, 1)
    assert ledger.footprint.of(first.name) == pytest.approx(1000, rel=0.01)
    ledger.completed(request(), RequestOutcome(first, 502, error="refused"), state)
    ledger.routed(second, 1000, state)  # the retry writes the prompt on another engine
    assert ledger.backlog.of(first.name) == (0, 0)
    assert ledger.backlog.of(second.name) == (1000, 1)
    assert ledger.footprint.of(second.name) == pytest.approx(1000, rel=0.01)
    assert ledger.completed(request(), RequestOutcome(second, 200, ttft_s=0.2), state) == 0.2
    assert ledger.completed(request(), RequestOutcome(second, 200, ttft_s=0.2), state) is None
    assert ledger.predictor.observations(second.name) == 1
    assert ledger.predictor.prefill_cost(second.name) > 0
