"""The `workflow` policy: a home per workflow, siblings follow it, spill once to a secondary."""

from typing import Any

import pytest

from hiveroute.assembly import Router, assemble
from hiveroute.config import RouterConfig
from hiveroute.engines.engine import Engine, EngineSpec
from hiveroute.metadata import RequestMetadata
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.base import CycleState, RoutingRequest
from hiveroute.workflows.model import WorkflowSettings
from hiveroute.workflows.placement import (
    PREDICTED_KEY,
    WorkflowPlacementScorer,
    best_home,
    homed_load,
)
from hiveroute.workflows.registry import WorkflowView
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


def request(workflow: str | None, agent: str, rid: str) -> RoutingRequest:
    return RoutingRequest(
        request_id=rid,
        path="/v1/chat/completions",
        body={"model": "m", "messages": [{"role": "system", "content": SHARED + agent}]},
        metadata=RequestMetadata(workflow_id=workflow, agent_id=agent),
    )


async def route(router: Router, req: RoutingRequest) -> tuple[str, str]:
    for hook in router.pipeline.hooks:
        await hook.before_route(req)
    decision, _ = await router.policy.route(req, router.pool.candidates(None))
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


async def test_new_home_prefers_free_kv_and_low_load() -> None:
    router, _ = make_router()
    e0, e1, e2, e3 = router.pool.engines
    e0.load.kv_usage, e1.load.kv_usage, e2.load.kv_usage, e3.load.kv_usage = 0.9, 0.2, 0.1, 0.1
    e2.load.in_flight = 3
    engine, reason = await route(router, request("w", "planner", "r1"))
    assert (engine, reason) == (e3.name, "workflow_new_home")


async def test_siblings_follow_home_then_spill_to_one_secondary() -> None:
    router, service = make_router(load_factor=1.0, slack=1, max_homes=2)
    home, reason = await route(router, request("w", "planner", "r0"))
    assert reason == "workflow_new_home"
    picks = [await route(router, request("w", f"executor-{i}", f"x{i}")) for i in range(8)]
    reasons = [r for _, r in picks]
    assert reasons[0] == "workflow_home"
    assert "workflow_new_spill" in reasons
    assert reasons.count("workflow_new_spill") == 1  # the context is replicated once
    engines = {e for e, _ in picks}
    assert len(engines) == 2 and home in engines  # siblings never scatter past the two homes
    view = service.registry.cached_view("w")
    assert view is not None and view.home == home and len(view.engines) == 2
    await service.flush()
    described = await service.registry.describe("w")
    assert described["home_engine"] == home
    assert described["secondary_engines"] == [e for e in engines if e != home]


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
        homes.append((await route(router, request(f"w{i}", "planner", f"r{i}")))[0])
        for engine in router.pool.engines:
            engine.load.in_flight = 0  # every request done: only the homes already given count
    assert sorted(homes.count(e.name) for e in router.pool.engines) == [2, 2, 2, 2]


async def test_an_agent_returns_to_its_own_engine_among_the_homes() -> None:
    router, _ = make_router(n=3, load_factor=1.0, slack=0)
    home, _ = await route(router, request("w", "planner", "r0"))
    home_engine = router.pool.get(home)
    assert home_engine is not None
    home_engine.load.in_flight = 10  # a fan-out overloads the home
    spill, reason = await route(router, request("w", "executor-0", "r1"))
    assert spill != home and reason == "workflow_new_spill"
    for engine in router.pool.engines:
        engine.load.in_flight = 0
    assert await route(router, request("w", "executor-0", "r2")) == (spill, "workflow_spill")
    for engine in router.pool.engines:
        engine.load.in_flight = 0
    assert await route(router, request("w", "executor-1", "r3")) == (home, "workflow_home")


async def test_a_pending_prefill_counts_until_its_first_token() -> None:
    router, _ = make_router(n=2)
    a, b = router.pool.engines
    b.load.in_flight = 1  # decoding: cheap to join
    huge, state = await send_huge_prompt(router, a)  # a now has ~80k tokens to prefill first
    a.load.in_flight += 1
    assert await route(router, request(None, "x", "r1")) == (b.name, "workflow_none")
    router.policy.on_first_token(huge, a, state)  # prefilled: a only decodes it now
    b.load.in_flight = (
        50  # (two would do, but a was just written 80k tokens: a new context avoids it)
    )
    assert await route(router, request(None, "x", "r2")) == (a.name, "workflow_none")


async def test_placement_reads_what_the_kv_index_says_each_engine_holds() -> None:
    from hiveroute.kvindex.blocks import block_keys
    from hiveroute.kvindex.events import BlockStored
    from hiveroute.routing.request_tokens import TOKEN_IDS_KEY

    router, _ = make_router(n=3)
    a, _idle, c = router.pool.engines
    a.load.in_flight, c.load.in_flight = 1, 1  # the middle one is idle ...
    req = request(None, "x", "r1")
    state = CycleState()
    await router.policy.prepare(req, state)
    tokens = state[TOKEN_IDS_KEY]
    assert tokens and len(tokens) > 1000
    index = router.kv_index
    size = 16
    count = len(tokens) // size
    hashes = [hash(k) for k in block_keys(tokens, size)][:count]
    index.apply(c.name, BlockStored(hashes, None, tokens[: count * size], size))
    # ... but c holds the whole prompt: predicted TTFT there is a queue slot, not a prefill
    assert await route(router, req) == (c.name, "workflow_none")


async def test_a_new_workflow_goes_to_the_engine_home_to_fewest_workflows_not_the_idlest() -> None:
    async def new_home(tolerance: float) -> str:
        router, _ = make_router(n=2, home_tolerance=tolerance)
        placement = router.policy.scorers[0].scorer
        assert isinstance(placement, WorkflowPlacementScorer)
        first, second = router.pool.engines
        second.load.in_flight = 100  # busy while two workflows arrive: both settle on `first`
        placement.home_tolerance = 10.0  # (balancing would send the second to `second`)
        for i in range(2):
            home, _ = await route(router, request(f"w{i}", "planner", f"r{i}"))
            assert home == first.name
            first.load.in_flight = 0  # their agents are in a tool call now
        placement.home_tolerance = tolerance
        second.load.in_flight = 3  # serving three requests, home to no workflow
        home, reason = await route(router, request("new", "planner", "r9"))
        assert reason == "workflow_new_home"
        return "homed" if home == first.name else "busy"

    assert await new_home(0.5) == "busy"  # two homed workflows will be back: balance the homes
    assert await new_home(2.5) == "homed"  # homes within the tolerance: the idlest now wins


def test_homed_load_weighs_workflows_by_context_size_and_fades_when_idle() -> None:
    def view(name: str, home: str, text: str, active_at: float, second: str = "") -> WorkflowView:
        v = WorkflowView(settings=WorkflowSettings(id=name, created_at=0.0, ttl_s=600.0))
        v.home, v.warm_text, v.last_active_at = home, text, active_at
        v.secondaries = [second] if second else []
        return v

    now = 1000.0
    views = [
        view("big", "a:1", "x" * 3000, now, second="c:1"),
        view("small", "b:1", "x" * 1000, now),
        view("gone", "c:1", "x" * 2000, now - 600.0),  # idle for ten minutes
    ]
    loads = homed_load(views, now)
    assert loads["a:1"] == pytest.approx(1.5)  # three times the small one's context (mean 2000)
    assert loads["b:1"] == pytest.approx(0.5)
    assert loads["c:1"] == pytest.approx(0.75, abs=0.01)  # half of "big"; "gone" has faded
    a, b, c = (Engine(spec=EngineSpec(url=f"http://{n}:1")) for n in "abc")
    c.load.in_flight = 2
    assert best_home([a, b, c], views, now).name == "b:1"  # a is idle but home to most
    b.load.in_flight = 5
    assert best_home([a, b, c], views, now).name == "c:1"  # within the tolerance of b: freer


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
    tokens = service.accountant.token_ids(req)
    assert calls == ["render"]  # the accountant reads what routing computed
    assert tokens == tokenizer.encode_uncached(
        original(req.body["messages"]), add_special_tokens=False
    )


async def test_a_request_without_workflow_starting_a_new_context_balances_kv_writes() -> None:
    router, _ = make_router(n=2)
    crowded, quiet = router.pool.engines
    router.costs.footprint.add(crowded.name, 50_000)
    quiet.load.in_flight = 1  # a little busier this instant
    engine, reason = await route(router, request(None, "chat", "r1"))
    assert (engine, reason) == (quiet.name, "workflow_none")
    quiet.load.in_flight = 500  # far slower: least predicted TTFT again
    engine, _ = await route(router, request(None, "chat2", "r2"))
    assert engine == crowded.name


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
        return dict(state[PREDICTED_KEY])

    before = await predicted()
    assert before[a.name] > 2 * before[b.name]  # 80k tokens to prefill first
    now[0] += 60.0
    after = await predicted()
    if drain:
        assert after[a.name] == pytest.approx(after[b.name])
    else:
        assert after[a.name] == pytest.approx(before[a.name])
