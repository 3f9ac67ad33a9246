"""The `workflow` policy: a home per workflow, siblings follow it, spill once to a secondary.

The decision is the `kv` cost (routing/cost.py); these engines send no KV events, so what an
engine holds is where the router's own decisions sent each prefix."""

from typing import Any

import pytest

from hiveroute.assembly import Router, assemble
from hiveroute.config import RouterConfig
from hiveroute.engines.engine import Engine
from hiveroute.kvindex.blocks import block_keys
from hiveroute.kvindex.events import BlockStored
from hiveroute.metadata import RequestMetadata
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.base import CycleState, RequestOutcome, RoutingRequest
from hiveroute.routing.cost import PRICES_KEY
from hiveroute.routing.request_tokens import TOKEN_IDS_KEY, prompt_tokens_of
from hiveroute.workflows.placement import WorkflowPlacementScorer
from hiveroute.workflows.service import WorkflowService

SHARED = "shared context words. " * 400


def make_router(n: int = 4, **params: Any) -> tuple[Router, WorkflowService]:
    spec = {"scorers": [{"name": "workflow_placement", **params}], "picker": "max_score"}
    config = RouterConfig(
        engine=[f"http://10.0.0.{i}:8000" for i in range(n)],
        policy="workflow",
        policies={"workflow": spec},
    ).validate()
    router = assemble(config)
    backlog: PrefillBacklog = router.costs.backlog
    backlog.clock = lambda: 0.0  # stopped: a backlog must not drain while a slow machine runs
    service: WorkflowService = router.workflows
    return router, service


def request(
    workflow: str | None, agent: str, rid: str, context: str = SHARED, own: int = 1
) -> RoutingRequest:
    """A request of `agent`: the workflow's shared `context`, then `own` words of its own."""
    content = context + " ".join([agent] * own)
    return RoutingRequest(
        request_id=rid,
        path="/v1/chat/completions",
        body={"model": "m", "messages": [{"role": "system", "content": content}]},
        metadata=RequestMetadata(workflow_id=workflow, agent_id=agent),
    )


async def route(router: Router, req: RoutingRequest, *, done: bool = False) -> tuple[str, str]:
    """Route `req`; it stays in flight there, or with `done` it completes at once."""
    for hook in router.pipeline.hooks:
        await hook.before_route(req)
    decision, state = await router.policy.route(req, router.pool.candidates(None))
    if done:
        router.policy.on_completed(req, RequestOutcome(decision.engine, 200), state)
    else:
        decision.engine.load.in_flight += 1
    return decision.engine.name, decision.reason


async def send_huge_prompt(router: Router, engine: Engine) -> tuple[RoutingRequest, CycleState]:
    """Route an ~80k-token prompt no engine holds to `engine` (its first token not yet back)."""
    huge = RoutingRequest(
        request_id="huge",
        path="/v1/completions",
        body={"model": "m", "prompt": "many fresh words " * 20000},
        metadata=RequestMetadata(),
    )
    state = CycleState()
    await router.policy.prepare(huge, state)
    router.policy.on_routed(huge, engine, state)
    return huge, state


async def test_a_new_home_goes_where_the_workflow_costs_least() -> None:
    router, _ = make_router()
    e0, e1, e2, e3 = router.pool.engines
    e0.load.in_flight, e1.load.in_flight, e2.load.in_flight = 2, 1, 3
    engine, reason = await route(router, request("w", "planner", "r1"))
    assert (engine, reason) == (e3.name, "workflow_new_home")


async def test_siblings_follow_home_then_spill_to_one_secondary() -> None:
    router, service = make_router()
    home, reason = await route(router, request("w", "planner", "r0"))
    assert reason == "workflow_new_home"
    picks = [await route(router, request("w", f"executor-{i}", f"x{i}")) for i in range(3)]
    assert picks == [(home, "workflow_home")] * 3  # waiting for the prefix beats recomputing it
    home_engine = router.pool.get(home)
    assert home_engine is not None
    home_engine.load.in_flight = 200  # the fan-out's requests decode there now: a long queue
    picks = [await route(router, request("w", f"worker-{i}", f"y{i}")) for i in range(4)]
    reasons = [r for _, r in picks]
    assert reasons[0] == "workflow_new_spill"
    assert reasons.count("workflow_new_spill") == 1  # the context is copied once
    engines = {e for e, _ in picks}
    assert len(engines) == 1 and home not in engines  # siblings follow the copy
    view = service.registry.cached_view("w")
    assert view is not None and view.home == home and len(view.engines) == 2
    await service.flush()
    described = await service.registry.describe("w")
    assert described["home_engine"] == home
    assert described["secondary_engines"] == sorted(engines)


async def test_home_wins_while_its_predicted_ttft_does() -> None:
    router, _ = make_router(n=2)
    home, _ = await route(router, request("w", "planner", "r0"))
    other = next(e for e in router.pool.engines if e.name != home)
    home_engine = router.pool.get(home)
    assert home_engine is not None
    home_engine.load.in_flight = 3  # busier, but holds the prefix: still the better TTFT
    assert await route(router, request("w", "executor", "r1")) == (home, "workflow_home")
    assert other.name != home


async def test_requests_without_workflow_go_where_ttft_is_least() -> None:
    router, _ = make_router(n=3)
    a, b, c = router.pool.engines
    a.load.in_flight, b.load.in_flight, c.load.in_flight = 4, 1, 2
    assert await route(router, request(None, "x", "r")) == (b.name, "workflow_none")


async def test_home_moves_when_its_engine_leaves() -> None:
    router, _ = make_router(n=3)
    home, _ = await route(router, request("w", "planner", "r0"))
    router.pool.remove(home)
    engine, reason = await route(router, request("w", "executor", "r1"))
    assert engine != home and reason == "workflow_home_moved"


async def test_new_homes_spread_over_idle_engines() -> None:
    router, _ = make_router(n=4)
    homes = []
    for i in range(8):
        own_context = f"context of workflow {i}. " * 200
        homes.append((await route(router, request(f"w{i}", "planner", f"r{i}", own_context)))[0])
        for engine in router.pool.engines:
            engine.load.in_flight = 0  # every request done: only where they live counts
    assert sorted(homes.count(e.name) for e in router.pool.engines) == [2, 2, 2, 2]


async def test_an_agent_returns_to_its_own_engine_among_the_homes() -> None:
    router, _ = make_router(n=3)
    home, _ = await route(router, request("w", "planner", "r0", own=100), done=True)
    home_engine = router.pool.get(home)
    assert home_engine is not None
    home_engine.load.in_flight = 200  # a fan-out overloads the home
    spill, reason = await route(router, request("w", "executor-0", "r1", own=100), done=True)
    assert spill != home and reason == "workflow_new_spill"
    for engine in router.pool.engines:
        engine.load.in_flight = 0
    # its own 100 words are cached on the spill engine only
    assert await route(router, request("w", "executor-0", "r2", own=101)) == (
        spill,
        "workflow_spill",
    )
    for engine in router.pool.engines:
        engine.load.in_flight = 0
    assert await route(router, request("w", "planner", "r3", own=101)) == (home, "workflow_home")


async def test_an_agent_returns_to_its_history_that_another_replica_placed() -> None:
    """Its previous request went through another replica to an engine this one also uses for
    the workflow. The KV index shows its history there; the workflow's other engines hold only
    the shared prefix, so they must not be priced as holding the history too."""
    from hiveroute.workflows.scope import scoped

    router, service = make_router(n=3)
    home, reason = await route(router, request("w", "planner", "r0"), done=True)
    assert reason == "workflow_new_home"
    other = next(e for e in router.pool.engines if e.name != home)
    view = await service.registry.view(scoped(None, "w"))
    assert view is not None
    view.secondaries.append(other.name)  # the workflow spilled there through a replica
    earlier = request("w", "executor-0", "elsewhere", own=600)
    state = CycleState()
    await router.policy.prepare(earlier, state)
    tokens = prompt_tokens_of(earlier, router.tokenizer)
    size = 16
    count = len(tokens) // size
    for engine in router.pool.engines:
        engine.block_size = size  # every engine sends KV events
    hashes = [hash(k) for k in block_keys(tokens, size)][:count]
    # the other replica sent executor-0 to `other`; the planner's prefix is on the home
    router.kv_index.apply(other.name, BlockStored(hashes, None, tokens[: count * size], size))
    shared = len(SHARED) // 8 // size  # well inside the shared context
    router.kv_index.apply(home, BlockStored(hashes[:shared], None, tokens[: shared * size], size))
    assert await route(router, request("w", "executor-0", "r1", own=601)) == (
        other.name,
        "workflow_spill",
    )


async def test_a_workflows_shared_prefix_is_what_all_its_prompts_began_with() -> None:
    from hiveroute.workflows.parents import PARENT_BLOCK
    from hiveroute.workflows.scope import scoped

    router, service = make_router(n=2)
    scorer = scorer_of(router)
    await route(router, request("ctx", "planner", "c0", own=50), done=True)
    view = await service.registry.view(scoped(None, "ctx"))
    assert view is not None
    alone = scorer.shared_prefix_tokens(view)  # one prompt seen: all of it
    await route(router, request("ctx", "executor", "c1", own=50), done=True)
    shared = scorer.shared_prefix_tokens(view)
    context = len(router.tokenizer.encode(SHARED, add_special_tokens=False))
    assert context - PARENT_BLOCK <= shared <= context + PARENT_BLOCK < alone
    # role first: the agents' prompts differ from their first words, nothing is shared
    await route(router, request("role", "planner", "r0", context="planner. " + SHARED), done=True)
    await route(router, request("role", "executor", "r1", context="executor. " + SHARED), done=True)
    role_view = await service.registry.view(scoped(None, "role"))
    assert role_view is not None and scorer.shared_prefix_tokens(role_view) < PARENT_BLOCK


async def test_a_new_workflows_first_prompt_is_priced_as_a_miss_on_its_home() -> None:
    """Nothing of a workflow's first prompt is on any engine yet: its home is not credited with
    it (it was, as the workflow's shared prefix), and its whole prefill joins the home's
    backlog, where the next request's price sees it."""
    router, _ = make_router(n=2)
    first = request("fresh", "planner", "f0", own=50)
    for hook in router.pipeline.hooks:
        await hook.before_route(first)
    decision, state = await router.policy.route(first, router.pool.candidates(None))
    n_tokens = len(state[TOKEN_IDS_KEY])
    prices = {c.engine.name: c for c in state[PRICES_KEY]}
    assert prices[decision.engine.name].cached_tokens == 0
    assert router.costs.backlog.of(decision.engine.name) == (n_tokens, 1)


async def test_a_pending_prefill_counts_until_its_first_token() -> None:
    router, _ = make_router(n=2)
    a, b = router.pool.engines
    b.load.in_flight = 1  # decoding: cheap to join
    huge, state = await send_huge_prompt(router, a)  # a now has ~80k tokens to prefill first
    a.load.in_flight += 1
    assert await route(router, request(None, "x", "r1")) == (b.name, "workflow_none")
    router.policy.on_first_token(huge, a, state)  # prefilled: a only decodes it now
    b.load.in_flight = 2
    other = "another conversation. " * 400
    assert await route(router, request(None, "y", "r2", other)) == (a.name, "workflow_none")


async def test_a_workflow_engine_with_kv_events_is_priced_at_what_its_index_says() -> None:
    """The workflow's shared prefix is lent only to its engines that send no KV events. Where
    an engine sends them, its index says what it holds: a secondary home that evicted the
    workflow's context is not priced as holding it (it was, so a sibling went there for a hit
    and prefilled the whole context again)."""
    from hiveroute.workflows.placement import HELD_KEY
    from hiveroute.workflows.scope import scoped

    router, service = make_router(n=3)
    home, _ = await route(router, request("w", "planner", "r0"), done=True)
    await route(router, request("w", "executor-0", "r1"), done=True)
    secondary = next(e for e in router.pool.engines if e.name != home)
    view = await service.registry.view(scoped(None, "w"))
    assert view is not None
    view.secondaries.append(secondary.name)  # the workflow spilled there once
    context = len(router.tokenizer.encode(SHARED, add_special_tokens=False))
    assert scorer_of(router).shared_prefix_tokens(view) >= context - 16

    def expected(state: CycleState) -> dict[str, int]:
        return {name: held.gpu_tokens for name, held in state[HELD_KEY].items()}

    # no engine sends KV events: both homes are expected to hold the context
    before = request("w", "executor-1", "r2")
    for hook in router.pipeline.hooks:
        await hook.before_route(before)
    _, state = await router.policy.route(before, router.pool.candidates(None))
    assert expected(state)[secondary.name] >= context - 16

    # every engine sends KV events; the secondary holds nothing of the prompt (evicted)
    tokens = state[TOKEN_IDS_KEY]
    size = 16
    count = len(tokens) // size
    for engine in router.pool.engines:
        engine.block_size = size
    hashes = [hash(k) for k in block_keys(tokens, size)][:count]
    router.kv_index.apply(home, BlockStored(hashes, None, tokens[: count * size], size))
    after = request("w", "executor-2", "r3")
    for hook in router.pipeline.hooks:
        await hook.before_route(after)
    _, state = await router.policy.route(after, router.pool.candidates(None))
    held = expected(state)
    assert held[secondary.name] == 0
    assert held[home] >= context - 16


def scorer_of(router: Router) -> WorkflowPlacementScorer:
    return next(
        w.scorer for w in router.policy.scorers if isinstance(w.scorer, WorkflowPlacementScorer)
    )


async def test_placement_reads_what_the_kv_index_says_each_engine_holds() -> None:
    router, _ = make_router(n=3)
    a, _idle, c = router.pool.engines
    a.load.in_flight, c.load.in_flight = 1, 1  # the middle one is idle ...
    req = request(None, "x", "r1")
    state = CycleState()
    await router.policy.prepare(req, state)
    tokens = prompt_tokens_of(req, router.tokenizer)
    assert tokens and len(tokens) > 1000
    index = router.kv_index
    size = 16
    count = len(tokens) // size
    hashes = [hash(k) for k in block_keys(tokens, size)][:count]
    index.apply(c.name, BlockStored(hashes, None, tokens[: count * size], size))
    # ... but c holds the whole prompt: predicted TTFT there is a queue slot, not a prefill
    assert await route(router, req) == (c.name, "workflow_none")


async def test_a_request_is_tokenized_once_for_routing_and_accounting() -> None:
    router, service = make_router(n=2)
    tokenizer = router.tokenizer
    calls: list[str] = []
    original = tokenizer.apply_chat_template

    def counting(*args: Any, **kwargs: Any) -> str:
        calls.append("render")
        return str(original(*args, **kwargs))

    tokenizer.apply_chat_template = counting
    req = request("w", "planner", "r1")
    await route(router, req)
    assert calls == ["render"]
    keys = service.accountant.block_keys(req)
    assert calls == ["render"]  # the accountant reads what routing computed
    tokens = tokenizer.encode_uncached(original(req.body["messages"]), add_special_tokens=False)
    assert keys == block_keys(tokens, service.accountant.block_size)


async def test_a_new_context_avoids_a_cache_full_of_live_contexts() -> None:
    router, _ = make_router(n=2)
    crowded, quiet = router.pool.engines
    index = router.kv_index
    live = router.costs.live
    live.clock = lambda: 0.0
    for e in (crowded, quiet):  # both filled their 1000 blocks once and evicted
        tokens = list(range(1000 * 16))
        hashes = [hash((e.name, i)) for i in range(1000)]
        index.apply(e.name, BlockStored(hashes, None, tokens, 16))
        index.block_removed(e.name, hashes[-1:])
    live.touch(crowded.name, list(range(900)))  # sessions in use fill crowded's cache
    engine, reason = await route(router, request(None, "chat", "r1"))
    assert (engine, reason) == (quiet.name, "workflow_none")


@pytest.mark.parametrize("drain", [True, False])
async def test_a_backlog_counts_as_drained_at_the_engines_prefill_rate(drain: bool) -> None:
    """An engine sent an 80k-token prompt a minute ago has prefilled it by now (at any sane
    prefill rate), though its first token is not back yet: it is predicted as free as an idle
    one. Without draining, it still counts every token sent."""
    router, _ = make_router(n=2, drain_backlog=drain)
    now = [1000.0]
    backlog: PrefillBacklog = router.costs.backlog
    backlog.clock = lambda: now[0]
    a, b = router.pool.engines
    await send_huge_prompt(router, a)

    async def predicted() -> dict[str, float]:
        state = CycleState()
        probe = request(None, "x", "probe")
        await router.policy.prepare(probe, state)
        router.policy.choose(probe, router.pool.candidates(None), state)
        return {c.engine.name: c.ttft_s for c in state[PRICES_KEY]}

    before = await predicted()
    assert before[a.name] > 2 * before[b.name]  # 80k tokens to prefill first
    now[0] += 60.0
    after = await predicted()
    if drain:
        assert after[a.name] == pytest.approx(after[b.name])
    else:
        # (the probe's length is estimated from as much of it as was tokenized, which the
        # first probe lengthened: a hundredth of a per cent apart)
        assert after[a.name] == pytest.approx(before[a.name], rel=1e-3)


async def test_a_sibling_tokenized_elsewhere_keeps_the_workflows_shared_prefix_whole() -> None:
    """A sibling reaching a router worker whose prefix cache never saw the workflow's context:
    before pricing, its prompt is tokenized as far as the workflow's shared prefix (and a block
    past it), not only as far as an engine could hold it, so the shared prefix is shortened
    only to what the prompts really share."""
    from hiveroute.kvindex.prefix_cache import PrefixEncodeCache, any_token_start
    from hiveroute.kvindex.tokenizer import BuiltinTokenizer, piece_boundary
    from hiveroute.workflows.scope import scoped

    router, service = make_router(n=2)
    context = SHARED * 4  # far longer than a head
    await route(router, request("w", "planner", "r0", context=context), done=True)
    view = await service.registry.view(scoped(None, "w"))
    assert view is not None and view.shared_chain is not None
    shared = len(view.shared_chain)
    tokenizer = router.tokenizer
    assert isinstance(tokenizer, BuiltinTokenizer)
    tokenizer.prefix_cache = PrefixEncodeCache(  # another worker's: it knows nothing yet
        tokenizer._encode_with_offsets, safe_split=any_token_start, segment_split=piece_boundary
    )
    await route(router, request("w", "executor", "r1", context=context, own=300))
    assert len(view.shared_chain) == shared - 1  # all but the block with the planner's own word
