"""The `kv` and `prefix` policies, the load guard and the TTFT predictor."""

import random
from typing import Any

import pytest

from hiveroute.bench.workloads.text import filler
from hiveroute.engines.engine import Engine, EngineSpec
from hiveroute.engines.pool import EnginePool
from hiveroute.errors import ConfigError
from hiveroute.kvindex.events import BlockStored
from hiveroute.kvindex.index import KvIndex
from hiveroute.kvindex.tokenizer import BuiltinTokenizer
from hiveroute.metadata import RequestMetadata
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.base import CycleState, Decision, RequestOutcome, RoutingRequest
from hiveroute.routing.cache_aware import KvTtftScorer
from hiveroute.routing.cost import CachedPrompt, RoutingCost
from hiveroute.routing.costs import CostModel
from hiveroute.routing.live_set import LiveSet
from hiveroute.routing.policy import Policy
from hiveroute.routing.registry import PluginContext, PluginRegistry, build_policy
from hiveroute.routing.request_tokens import PREFIX_MATCH_KEY, TOKEN_IDS_KEY
from hiveroute.routing.retention import Retention
from hiveroute.routing.ttft import RoutedFeatures, TtftPredictor, learn_ttft
from hiveroute.routing.ttft_ledger import ROUTED_KEY, TtftLedger
from hiveroute.workflows.placement import WorkflowPlacementScorer
from tests.support.workflows import workflow_service

BS = 16
PROMPT = " ".join(f"word{i}" for i in range(200))  # ~400 tokens with the built-in tokenizer


def make(
    n: int,
    policy: str,
    *,
    predictor: TtftPredictor | None = None,
    live: LiveSet | None = None,
) -> tuple[EnginePool, Policy, PluginContext]:
    pool = EnginePool([EngineSpec(f"http://127.0.0.1:{8100 + i}") for i in range(n)])
    # a stopped clock: a backlog must not drain while a slow machine runs the test
    costs = CostModel(backlog=PrefillBacklog(clock=lambda: 0.0))
    if predictor is not None:
        costs.predictor = predictor
    if live is not None:
        costs.live = live
    svc = PluginContext(pool, tokenizer=BuiltinTokenizer(), kv_index=KvIndex(), costs=costs)
    return pool, build_policy(policy, svc), svc


def with_scorers(*scorers: str) -> tuple[EnginePool, Policy, PluginContext]:
    """Two engines and a policy of `scorers` (`workflow_placement` among them needs the
    workflow service the router would give it)."""
    pool = EnginePool([EngineSpec(f"http://127.0.0.1:{8100 + i}") for i in range(2)])
    svc = PluginContext(pool, tokenizer=BuiltinTokenizer(), kv_index=KvIndex())
    plugins = PluginRegistry()
    workflows = workflow_service(pool)
    plugins.register(
        "workflow_placement", lambda ctx, **kw: WorkflowPlacementScorer(ctx, workflows, **kw)
    )
    custom = {"custom": {"scorers": [{"name": name} for name in scorers]}}
    return pool, build_policy("custom", svc, custom, plugins), svc


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


async def test_equal_costs_go_to_the_emptier_engine_then_the_longer_match() -> None:
    """With no prefill cost a cached prefix saves nothing: every cost is equal, and the
    decision is plain load balancing; among engines equally empty, the one holding more."""
    pool, policy, svc = make(3, "kv", predictor=TtftPredictor(prefill_s_per_token=0.0))
    tokens = BuiltinTokenizer().encode(PROMPT)
    for e in pool.engines:
        svc.kv_index.set_block_size(e.name, BS)
    cache_on(svc.kv_index, "127.0.0.1:8102", tokens[:64])  # saves nothing at no prefill cost
    decision, _ = await route(policy, pool, request(rid="a"))
    assert decision.engine.name == "127.0.0.1:8102" and decision.reason == "kv_hit"
    fresh = " ".join(f"new{i}" for i in range(100))  # nobody holds it: the emptiest engine
    first, _ = await route(policy, pool, request(fresh, rid="b"))
    assert first.engine.name == "127.0.0.1:8100"  # 8102 holds live blocks now
    second, _ = await route(policy, pool, request(fresh + " other", rid="c"))
    assert second.engine.name == "127.0.0.1:8101"  # the only engine with no live blocks


async def test_a_busy_holder_keeps_its_prefix_until_its_queue_costs_more_than_a_recompute() -> None:
    slow = TtftPredictor(prefill_s_per_token=1e-2)  # recomputing would cost seconds
    pool, policy, svc = make(4, "kv", predictor=slow)
    tokens = BuiltinTokenizer().encode(PROMPT)
    cache_on(svc.kv_index, "127.0.0.1:8100", tokens)
    for e in pool.engines[1:]:
        svc.kv_index.set_block_size(e.name, BS)
    pool.engines[0].load.in_flight = 20
    decision, _ = await route(policy, pool, request(rid="a"))
    assert decision.engine is pool.engines[0] and decision.reason == "kv_hit"  # worth the wait
    # 20 s of queueing: more than prefilling it again elsewhere (4 s) and the engine time
    # that prefill takes from others there (4 s)
    pool.engines[0].load.in_flight = 1000
    decision, _ = await route(policy, pool, request(rid="b"))
    assert decision.engine is not pool.engines[0] and decision.reason == "kv_ttft_tradeoff"


async def test_prefix_load_guard_never_makes_the_cache_holder_the_bottleneck() -> None:
    pool, policy, _ = make(4, "prefix")
    first, _ = await route(policy, pool, request(rid="a"))
    first.engine.load.in_flight = 3
    decision, _ = await route(policy, pool, request(rid="b"))
    assert decision.engine is first.engine and decision.reason == "prefix_hit"
    first.engine.load.in_flight = 10  # prefix's guard: bound = ceil(1.5 * 11 / 4) + 2 = 7
    decision, _ = await route(policy, pool, request(rid="c"))
    assert decision.engine is not first.engine and decision.reason == "load_guard"


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
    # a whole answer whose length is unknown (no usage in it) may be just as long
    unknown = RoutingRequest("u", "/v1/completions", {"prompt": "x"}, RequestMetadata())
    _, state3 = await route(policy, pool, unknown)
    policy.on_completed(unknown, RequestOutcome(engine, 200, 3.0), state3)
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
    holder.load.in_flight -= 1  # ... and is done
    decision = await decide("again")
    assert decision.engine is holder and decision.reason == "kv_hit"
    policy.on_completed(long_req, RequestOutcome(holder, 200, ttft_s=0.5), state)
    assert scorer.ledger.backlog.of(holder.name) == (0, 0)  # settled once, not twice


async def test_a_new_context_goes_where_the_cache_holds_fewer_live_contexts() -> None:
    """Writing into a cache full of live contexts evicts some that will be prefilled again;
    into one with free room, nothing. Before an engine has ever evicted, it has room."""
    now = [0.0]
    live = LiveSet(window_s=30.0, clock=lambda: now[0])
    pool, policy, svc = make(2, "kv", live=live)
    index: KvIndex = svc.kv_index
    crowded, quiet = pool.engines
    for e in pool.engines:
        index.set_block_size(e.name, BS)
        fill(index, e.name, 100)  # each has filled its 100 blocks and evicted once
    live.touch(crowded.name, [(1, i) for i in range(90)])  # 90 live blocks: sessions in use
    live.touch(quiet.name, [(2, i) for i in range(10)])

    async def decide(rid: str) -> Decision:
        state = CycleState()
        fresh = request(" ".join(f"{rid}{i}" for i in range(400)), rid=rid)
        await policy.prepare(fresh, state)
        return policy.choose(fresh, pool.candidates("m"), state)

    decision = await decide("new")
    assert decision.engine is quiet and decision.reason == "kv_miss"
    now[0] = 31.0  # the crowded engine's sessions are over: its cache is free to reuse
    quiet.load.in_flight = 1  # and the other is busier this instant
    decision = await decide("later")
    assert decision.engine is crowded


def fill(index: KvIndex, engine: str, blocks: int) -> None:
    """The engine stored `blocks` blocks and evicted one: its capacity is known."""
    tokens = list(range(blocks * BS))
    hashes = [hash((engine, i)) for i in range(blocks)]
    index.apply(engine, BlockStored(hashes, None, tokens, BS))
    index.block_removed(engine, hashes[-1:])


def test_the_live_set_keeps_blocks_touched_within_its_window() -> None:
    now = [0.0]
    live = LiveSet(window_s=10.0, clock=lambda: now[0])
    live.touch("a", [1, 2, 3])
    now[0] = 6.0
    live.touch("a", [3, 4])  # 3 touched again: live until 16
    assert live.blocks("a") == 4 and live.blocks("b") == 0
    now[0] = 11.0
    assert live.blocks("a") == 2  # 1 and 2 expired
    now[0] = 17.0
    assert live.blocks("a") == 0
    with pytest.raises(ValueError):
        LiveSet(window_s=0)


def test_a_prompt_that_extends_a_recent_one_touches_only_its_new_blocks() -> None:
    """A key names its whole prefix: when the last shared key was touched within the sweep's
    granularity (window / 16), so was everything before it, and only the new tail is touched
    again; when that touch is older, the whole prompt is."""
    now = [0.0]
    live = LiveSet(window_s=16.0, clock=lambda: now[0])  # granularity: 1 s
    live.touch("a", [1, 2, 3])
    now[0] = 0.5
    live.touch("a", [1, 2, 3, 4, 5], shared_blocks=3)  # 1-3 keep their touch at 0
    assert live.blocks("a") == 5
    now[0] = 16.2
    assert live.blocks("a") == 2  # 1-3 expired with their touch at 0; 4 and 5 live to 16.5
    now[0] = 20.0
    live.touch("a", [4, 5, 6])
    now[0] = 22.0  # 5's touch is 2 s old, past the granularity: all are touched again
    live.touch("a", [4, 5, 6, 7], shared_blocks=3)
    now[0] = 37.5
    assert live.blocks("a") == 4  # all touched at 22, live to 38


def test_an_engines_capacity_is_known_once_it_has_evicted() -> None:
    index = KvIndex()
    index.apply("e", BlockStored([1, 2, 3], None, list(range(3 * BS)), BS))
    assert index.capacity_blocks("e") is None  # it never had to evict: it has room
    index.block_removed("e", [3])
    assert index.capacity_blocks("e") == 3


def test_the_cost_of_a_placement_is_its_ttft_its_engine_time_and_what_it_evicts() -> None:
    predictor = TtftPredictor(base_s=0.01, queue_s_per_request=0.02, prefill_s_per_token=1e-4)
    ledger = TtftLedger(predictor, PrefillBacklog(clock=lambda: 0.0))
    index, live = KvIndex(), LiveSet(clock=lambda: 0.0)
    cost = RoutingCost(ledger, live, index, Retention())
    engine = Engine(EngineSpec("http://127.0.0.1:8100"))
    engine.load.in_flight = 2  # two requests decoding there
    idle = cost.price(engine, 1000, CachedPrompt(gpu_tokens=400))
    assert idle.ttft_s == pytest.approx(0.01 + 2 * 0.02 + 600 * 1e-4)
    assert idle.delay_s == pytest.approx(600 * 1e-4 * 3)  # the two decoding, and the next
    assert idle.evict_s == 0.0  # the engine never evicted: it has room
    fill(index, engine.name, 10)
    live.touch(engine.name, list(range(5)))  # half its cache is live
    full = cost.price(engine, 1000, CachedPrompt(gpu_tokens=400))
    assert full.evict_s == pytest.approx(600 * 1e-4 * 0.5)
    assert full.total_s == pytest.approx(full.ttft_s + full.delay_s + full.evict_s)


def test_a_shared_system_prompt_does_not_keep_new_sessions_off_the_engines_lacking_it() -> None:
    """Every session starts with the same system prompt, cached on one engine only: it saves a
    little prefill there, but a new session still goes where it costs the fleet least, and the
    engines lacking the prompt get it copied once."""
    predictor = TtftPredictor(base_s=0.01, queue_s_per_request=0.02, prefill_s_per_token=1e-4)
    ledger = TtftLedger(predictor, PrefillBacklog(clock=lambda: 0.0))
    cost = RoutingCost(ledger, LiveSet(clock=lambda: 0.0), KvIndex(), Retention())
    engines = [Engine(EngineSpec(f"http://127.0.0.1:{8100 + i}")) for i in range(4)]
    holder = engines[0]
    holder.load.in_flight = 2  # it took the first sessions
    prices = [
        cost.price(e, 10_000, CachedPrompt(gpu_tokens=1000 if e is holder else 0)) for e in engines
    ]
    assert cost.cheapest(prices).engine is not holder


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
    """`kv_ttft` and `workflow_placement` share the router's backlog, live set and predictor:
    one routed request is one backlog entry and one observation, however many plugins see
    it."""
    pool, policy, svc = with_scorers("kv_ttft", "workflow_placement")
    req = request()
    decision, state = await route(policy, pool, req)
    engine = decision.engine
    n_tokens = len(BuiltinTokenizer().encode(PROMPT))
    assert svc.costs.backlog.of(engine.name) == (n_tokens, 1)
    # no events, so no block size: the workflow scorer's memory of its decisions (16-token
    # blocks) is what it touches
    assert svc.costs.live.blocks(engine.name) == n_tokens // 16
    policy.on_completed(req, RequestOutcome(engine, 200, ttft_s=0.05), state)
    assert svc.costs.backlog.of(engine.name) == (0, 0)
    assert svc.costs.predictor.observations(engine.name) == 1


def test_a_ledger_counts_a_retry_on_another_engine_but_learns_once() -> None:
    ledger = TtftLedger()
    first, second = (Engine(EngineSpec(f"http://127.0.0.1:{8100 + i}")) for i in range(2))
    state = CycleState()
    ledger.routed(first, 1000, state)
    ledger.routed(first, 1000, state)  # a second plugin on the same decision
    assert ledger.backlog.of(first.name) == (1000, 1)
    ledger.completed(request(), RequestOutcome(first, 502, error="refused"), state)
    ledger.routed(second, 1000, state)  # the retry writes the prompt on another engine
    assert ledger.backlog.of(first.name) == (0, 0)
    assert ledger.backlog.of(second.name) == (1000, 1)
    assert ledger.completed(request(), RequestOutcome(second, 200, ttft_s=0.2), state) == 0.2
    assert ledger.completed(request(), RequestOutcome(second, 200, ttft_s=0.2), state) is None
    assert ledger.predictor.observations(second.name) == 1
    assert ledger.predictor.prefill_cost(second.name) > 0


def test_an_engine_not_measured_yet_is_predicted_as_the_measured_ones() -> None:
    """Engines behind one router usually serve one model on one kind of hardware. An engine
    that kept the (slow) defaults because it got no request early would never get one."""
    predictor = TtftPredictor(prefill_s_per_token=1e-4)
    for _ in range(50):  # "a" prefills at 2e-5 s a token
        predictor.observe("a", queue_depth=0, uncached_tokens=5000, ttft_s=0.01 + 0.1)
        predictor.observe("a", queue_depth=0, uncached_tokens=1000, ttft_s=0.01 + 0.02)
    assert predictor.prefill_cost("a") == pytest.approx(2e-5, rel=0.1)
    assert predictor.prefill_cost("b") == pytest.approx(predictor.prefill_cost("a"), rel=0.05)
    predictor.observe("b", queue_depth=0, uncached_tokens=5000, ttft_s=0.2)  # b is slower
    assert 2e-5 < predictor.prefill_cost("b") < 1e-4  # from the fleet's model, not the default


def test_a_per_token_cost_measured_on_one_engine_prices_long_prompts_on_all() -> None:
    """Engine "b" served only cached prompts (300 new tokens each), from before any engine had
    prefilled a long one; "a" then measured 33k-token prefills. With a fit per engine, b kept
    most of the defaults' per-token cost, and a new 33k-token context was priced 1.6x higher
    there (1.5 s against 1.0): new contexts kept off an engine of the same kind."""
    predictor = TtftPredictor()
    for _ in range(20):
        predictor.observe("b", queue_depth=0, uncached_tokens=300, ttft_s=0.02)
    for _ in range(20):
        predictor.observe("a", queue_depth=0, uncached_tokens=33_000, ttft_s=0.9)
        predictor.observe("a", queue_depth=0, uncached_tokens=300, ttft_s=0.02)
        predictor.observe("b", queue_depth=0, uncached_tokens=300, ttft_s=0.02)
    long_a = predictor.predict("a", queue_depth=0, uncached_tokens=33_000)
    long_b = predictor.predict("b", queue_depth=0, uncached_tokens=33_000)
    assert long_b == pytest.approx(long_a, rel=0.1)
    assert long_a == pytest.approx(0.9, rel=0.3)


def test_an_engine_whose_first_ttfts_were_slow_is_predicted_near_the_fleet() -> None:
    """A cold start makes an engine's first TTFTs slow; predicted from those alone it would get
    no further request, and so never show it is as fast as the others."""
    predictor = TtftPredictor()
    for _ in range(60):  # "a" is well measured: 2e-5 s a token
        predictor.observe("a", queue_depth=0, uncached_tokens=5000, ttft_s=0.11)
        predictor.observe("a", queue_depth=0, uncached_tokens=1000, ttft_s=0.03)
    predictor.observe("b", queue_depth=0, uncached_tokens=1200, ttft_s=0.09)  # cold: 2-3x
    predictor.observe("b", queue_depth=0, uncached_tokens=1200, ttft_s=0.07)
    alone = TtftPredictor()  # b's two TTFTs with no fleet to lean on
    alone.observe("b", queue_depth=0, uncached_tokens=1200, ttft_s=0.09)
    alone.observe("b", queue_depth=0, uncached_tokens=1200, ttft_s=0.07)
    assert predictor.prefill_cost("b") < 1.5 * predictor.prefill_cost("a")
    assert predictor.prefill_cost("b") < 0.5 * alone.prefill_cost("b")
    for _ in range(200):  # b really is slower: its own measurements win over time
        predictor.observe("b", queue_depth=0, uncached_tokens=5000, ttft_s=0.51)
        predictor.observe("b", queue_depth=0, uncached_tokens=1000, ttft_s=0.11)
        predictor.observe("a", queue_depth=0, uncached_tokens=5000, ttft_s=0.11)
    assert predictor.prefill_cost("b") > 2 * predictor.prefill_cost("a")


def test_an_engine_the_router_stopped_using_drifts_back_to_the_fleets_prediction() -> None:
    """Engines of one kind: "b" measured slow a few times (its prefills met bursts) and got
    no request since. Its own fit ages with every TTFT the fleet measures after it, so it is
    predicted as the others again, instead of staying idle on stale evidence."""
    predictor = TtftPredictor()
    for _ in range(30):
        predictor.observe("a", queue_depth=0, uncached_tokens=5000, ttft_s=0.11)
        predictor.observe("b", queue_depth=0, uncached_tokens=5000, ttft_s=0.31)
    stale = predictor.prefill_cost("b")
    assert stale > 1.5 * predictor.prefill_cost("a")  # freshly measured, b is slower
    for _ in range(150):  # only "a" serves from now on
        predictor.observe("a", queue_depth=0, uncached_tokens=5000, ttft_s=0.11)
        predictor.observe("a", queue_depth=0, uncached_tokens=1000, ttft_s=0.03)
    assert predictor.prefill_cost("b") < 1.2 * predictor.prefill_cost("a") < stale


def test_a_fit_stays_bounded_over_many_ttfts_its_features_explain_poorly() -> None:
    """A router runs for days. TTFTs that the features hardly explain (here: random) once made
    the fit's covariance lose its symmetry bit by bit until it diverged, after about 7,000 of
    them, to predictions of 1.5 million seconds."""
    rng = random.Random(0)
    predictor = TtftPredictor()
    for i in range(12_000):
        engine = "abcd"[i % 4]
        queue, tokens = rng.randint(0, 5), rng.randint(100, 5000)
        predicted = predictor.predict(engine, queue_depth=queue, uncached_tokens=tokens)
        assert 0.0 <= predicted < 1.0, (i, predicted)
        ttft = 0.05 + rng.random() * 0.1
        predictor.observe(engine, queue_depth=queue, uncached_tokens=tokens, ttft_s=ttft)


def test_the_prediction_error_is_what_the_measured_ttfts_missed_by_relative_to_them() -> None:
    predictor = TtftPredictor()
    assert predictor.relative_error() == 0.0  # nothing measured: costs are compared exactly
    predictor.observe("a", queue_depth=0, uncached_tokens=5000, ttft_s=0.11)
    assert predictor.relative_error() == 0.0  # that was predicted from the defaults alone
    for i in range(400):  # 2e-5 s a token, and every TTFT 10 % off one way or the other
        off = 1.1 if i % 2 else 1 / 1.1
        predictor.observe("a", queue_depth=0, uncached_tokens=5000, ttft_s=0.11 * off)
        predictor.observe("a", queue_depth=0, uncached_tokens=1000, ttft_s=0.03 * off)
    assert 0.06 < predictor.relative_error() < 0.14


def test_the_cache_size_an_engine_reports_prices_evictions_before_it_ever_evicts() -> None:
    engine = Engine(EngineSpec("http://127.0.0.1:8100"))
    metrics = (
        "vllm:num_requests_running 0\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1.0\n'
    )
    EnginePool._apply_metrics(engine, metrics)
    assert engine.kv_capacity_blocks == 10 and engine.block_size == 16
    predictor = TtftPredictor(prefill_s_per_token=1e-4)
    live = LiveSet(clock=lambda: 0.0)
    cost = RoutingCost(
        TtftLedger(predictor, PrefillBacklog(clock=lambda: 0.0)), live, KvIndex(), Retention()
    )
    live.touch(engine.name, list(range(5)))  # half its 10 blocks hold live contexts
    priced = cost.price(engine, 1000, CachedPrompt())
    assert priced.evict_s == pytest.approx(1000 * 1e-4 * 0.5)


@pytest.mark.parametrize("scorer", ["kv_ttft", "workflow_placement"])
async def test_a_ttft_is_learned_against_the_load_the_decision_priced(scorer: str) -> None:
    """The plugins hear where a request went after it is sent (`decide_then_send`), when its
    engine already counts it in flight. Learning its TTFT against the load read then taught
    each engine's predictor a queue one deeper than its decisions saw, and an engine starved."""
    pool, policy, svc = with_scorers(scorer)
    req = request()
    state = CycleState()
    await policy.prepare(req, state)
    decision = policy.decide_then_send(req, pool.candidates("m"), state)
    decision.engine.load.in_flight += 1  # the pipeline sends it
    policy.catch_up()
    routed = state[ROUTED_KEY]
    assert routed.queue_depth == 0.0  # the idle engine the price saw, not the request itself
    assert routed.backlog_tokens == 0.0
    assert svc.costs.backlog.of(decision.engine.name)[1] == 1  # and it is in the backlog


@pytest.mark.parametrize("scorer", ["kv_ttft", "workflow_placement"])
async def test_a_prompt_held_on_a_lower_tier_is_learned_against_as_one(scorer: str) -> None:
    """Both pricing scorers learn a TTFT against the features they priced it with: blocks an
    engine offloaded (CPU, LMCache) count as lower-tier tokens, not as nothing to prefill."""
    pool, policy, svc = with_scorers(scorer)
    tokens = BuiltinTokenizer().encode(PROMPT)
    held = len(tokens) // BS * BS
    for e in pool.engines:
        offloaded = BlockStored(
            list(range(1000, 1000 + held // BS)), None, tokens[:held], BS, "CPU"
        )
        svc.kv_index.apply(e.name, offloaded)
    _, state = await route(policy, pool, request())
    routed = state[ROUTED_KEY]
    assert routed.lower_tier_tokens == held
    assert routed.uncached_tokens == len(tokens) - held


def test_an_engine_that_leaves_the_pool_leaves_nothing_learned_of_it() -> None:
    """What the router learned of an engine (its TTFT factor, its live blocks, what its cache
    kept) goes with it: kept, it would grow with every engine a churning pool ever had, and an
    engine back under the same name (restarted, its cache empty) would be priced as the old."""
    from hiveroute.assembly import assemble
    from hiveroute.config import RouterConfig
    from hiveroute.kvindex.index import PrefixMatch

    config = RouterConfig(engine=["http://127.0.0.1:8100", "http://127.0.0.1:8101"], policy="kv")
    router = assemble(config.validate())
    costs, name = router.costs, "127.0.0.1:8100"
    for ttft_s in (0.05, 0.08, 0.3):
        costs.predictor.observe(name, queue_depth=0, uncached_tokens=100, ttft_s=ttft_s)
    costs.live.touch(name, [1, 2, 3])
    costs.retention.placed(name, [1, 2, 3])
    costs.retention.observe([1, 2, 3, 4], {name: PrefixMatch(BS, gpu_blocks=1)})  # 1 of 3 kept
    assert costs.predictor.observations(name) == 3
    assert costs.live.blocks(name) == 3 and costs.retention.kept(name) < 1.0

    router.pool.remove(name)
    assert costs.predictor.observations(name) == 0
    assert costs.predictor.prefill_cost(name) == costs.predictor.prefill_cost("never seen")
    assert costs.live.blocks(name) == 0 and costs.retention.kept(name) == 1.0


async def test_a_retry_elsewhere_says_why_it_chose_its_own_engine() -> None:
    """The first attempt went to the engine holding the prompt (`kv_hit`); a retry among the
    others, which hold nothing, is a `kv_miss`, not the first attempt's reason again."""
    pool, policy, svc = make(2, "kv")
    tokens = BuiltinTokenizer().encode(PROMPT)
    cache_on(svc.kv_index, "127.0.0.1:8101", tokens)
    req = request()
    first, state = await route(policy, pool, req)
    assert first.engine.name == "127.0.0.1:8101" and first.reason == "kv_hit"
    others = [e for e in pool.candidates("m") if e is not first.engine]
    retry = policy.decide(req, others, state)
    assert retry.engine.name == "127.0.0.1:8100" and retry.reason == "kv_miss"


def _policy(name: str) -> tuple[EnginePool, Policy, PluginContext]:
    """`kv`, or `workflow`'s placement alone: the two share the decision."""
    pool, policy, svc = make(3, "kv") if name == "kv" else with_scorers("workflow_placement")
    for e in pool.engines:
        svc.kv_index.set_block_size(e.name, BS)
    return pool, policy, svc


@pytest.mark.parametrize("policy_name", ["kv", "workflow"])
async def test_a_prompt_no_engine_holds_is_tokenized_past_its_head_once_it_is_sent(
    policy_name: str,
) -> None:
    """Every engine holds the system prompt, none the new text behind it: the decision needs
    the prompt's tokens only a block past the system prompt. The rest is tokenized once the
    request is on its way, for the bookkeeping that serves later decisions."""
    pool, policy, svc = _policy(policy_name)
    tokenizer = svc.tokenizer
    assert tokenizer is not None
    system = filler(1_500, "system prompt")  # long enough for the prefix cache to keep
    held = tokenizer.encode(system)  # an earlier request: the prefix cache knows it
    for e in pool.engines:
        cache_on(svc.kv_index, e.name, held)
    text = system + filler(8_000, "a new question")
    req = request(text)
    state = CycleState()
    await policy.prepare(req, state)
    decision = policy.decide_then_send(req, pool.candidates("m"), state)
    assert tokenizer.name not in req.derived.token_ids  # not tokenized whole before sending
    head = req.derived.heads[tokenizer.name]
    assert head.covered_chars < len(text) // 4
    whole = BuiltinTokenizer().encode_uncached(text)
    assert head.ids == whole[: len(head.ids)]
    assert 0.9 < head.estimated_tokens / len(whole) < 1.1
    matches = state[PREFIX_MATCH_KEY]
    assert {m.tokens for m in matches.values()} == {len(held) // BS * BS}
    policy.catch_up()  # the bytes are out: the plugins hear where the request went
    assert req.derived.token_ids[tokenizer.name] == whole
    assert decision.engine.name in {e.name for e in pool.engines}


@pytest.mark.parametrize("policy_name", ["kv", "workflow"])
async def test_a_match_reads_the_prompt_on_while_an_engine_holds_all_of_it(
    policy_name: str,
) -> None:
    """An engine holds most of a prompt this router never tokenized (another replica sent
    it): the head is lengthened until the match stops inside it, so the match is the same
    as on the whole prompt's tokens."""
    pool, policy, svc = _policy(policy_name)
    text = filler(12_000, "another replica's conversation")
    whole = BuiltinTokenizer().encode_uncached(text)
    holder = pool.engines[1].name
    cache_on(svc.kv_index, holder, whole[: len(whole) * 3 // 4])
    decision, state = await route(policy, pool, request(text))
    matches = state[PREFIX_MATCH_KEY]
    assert matches[holder].tokens == len(whole) * 3 // 4 // BS * BS
    assert decision.engine.name == holder
