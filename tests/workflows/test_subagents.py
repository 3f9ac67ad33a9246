"""Subagents: placed with their parent's engine while the predicted cost allows.

A request naming a parent (`parent_agent_id`, `parent_session_id`, `parent_request_id`) that
this router placed expects the parent's engine to hold what the two prompts share, and that
engine comes first among equal costs; a parent's engine that has become the costlier place
is left for another. The hand-off parent -> subagent is measured. These engines send no KV
events (the router's own decisions are what it knows)."""

from hiveroute.kvindex.blocks import block_keys
from hiveroute.metadata import RequestMetadata
from hiveroute.routing.base import CycleState, RoutingRequest
from hiveroute.routing.request_tokens import TOKEN_IDS_KEY
from hiveroute.workflows.parents import PARENT_BLOCK, chain_from_keys
from hiveroute.workflows.placement import PARENT_KEY, WorkflowPlacementScorer
from tests.workflows.test_placement import SHARED, make_router, route


def ask(rid: str, text: str, **meta: str) -> RoutingRequest:
    return RoutingRequest(
        request_id=rid,
        path="/v1/chat/completions",
        body={"model": "m", "messages": [{"role": "user", "content": text}]},
        metadata=RequestMetadata(**meta),
    )


async def test_a_subagent_goes_to_its_parents_engine_until_that_costs_more() -> None:
    router, _ = make_router(n=2)
    parent_engine, _ = await route(router, ask("p-1", SHARED, agent_id="lead"), done=True)
    placed = []
    for i in range(12):  # each stays in flight: the parent's engine fills with prefill work
        text = SHARED + f" subtask {i} " + "own words " * 300
        placed.append(await route(router, ask(f"s-{i}", text, parent_agent_id="lead")))
    assert placed[0] == (parent_engine, "subagent_parent")
    assert any(engine != parent_engine for engine, _ in placed[1:])  # the cost spilled them
    handoffs = router.metrics.registry.get_sample_value("hiveroute_handoff_latency_seconds_count")
    assert handoffs == 12  # each subagent's start after its parent's end


async def test_parents_are_found_by_session_and_request_id_and_unknown_ones_change_nothing() -> (
    None
):
    router, _ = make_router(n=3)
    by_session, _ = await route(router, ask("p-2", SHARED, session_id="sess"), done=True)
    engine, reason = await route(
        router, ask("c-1", SHARED + " child", parent_session_id="sess"), done=True
    )
    assert (engine, reason) == (by_session, "subagent_parent")
    engine, reason = await route(
        router, ask("c-2", SHARED + " child two", parent_request_id="p-2"), done=True
    )
    assert (engine, reason) == (by_session, "subagent_parent")
    _, reason = await route(router, ask("c-3", "unrelated", parent_agent_id="nobody"), done=True)
    assert reason == "workflow_none"


async def test_the_parents_engine_lends_what_the_prompts_share() -> None:
    router, _ = make_router(n=2)
    scorer = next(
        w.scorer for w in router.policy.scorers if isinstance(w.scorer, WorkflowPlacementScorer)
    )
    parent_tokens = list(range(1000, 1000 + PARENT_BLOCK * 10))
    child_tokens = parent_tokens[: PARENT_BLOCK * 6] + [7] * PARENT_BLOCK * 4
    engines = router.pool.candidates(None)
    home = engines[0].name  # the parent's engine
    scorer.parents.routed(
        ["a:lead"], home, chain_from_keys(block_keys(parent_tokens, PARENT_BLOCK))
    )
    meta = RequestMetadata(parent_agent_id="lead")
    state = CycleState()
    state[PARENT_KEY] = scorer.parents.parent_of(meta, None)
    state[TOKEN_IDS_KEY] = child_tokens
    request = RoutingRequest("c", "/v1/completions", {"prompt": child_tokens}, meta)
    held = scorer.expected(request, state, None, engines)
    assert held[home].gpu_tokens == PARENT_BLOCK * 6  # what the two prompts share
    assert held[engines[1].name].gpu_tokens == 0


async def test_an_engine_with_kv_events_lends_only_what_its_index_still_holds() -> None:
    """A conversation's next turn names the previous one as its parent; on an engine that
    sends KV events, the index (not the parent map) says whether the history survived."""
    router, _ = make_router(n=2)
    scorer = next(
        w.scorer for w in router.policy.scorers if isinstance(w.scorer, WorkflowPlacementScorer)
    )
    parent_tokens = list(range(1000, 1000 + PARENT_BLOCK * 10))
    engines = router.pool.candidates(None)
    home = engines[0]
    home.block_size = PARENT_BLOCK  # its events have told the router its block size
    scorer.parents.routed(
        ["a:lead"], home.name, chain_from_keys(block_keys(parent_tokens, PARENT_BLOCK))
    )
    meta = RequestMetadata(parent_agent_id="lead")
    state = CycleState()
    state[PARENT_KEY] = scorer.parents.parent_of(meta, None)
    state[TOKEN_IDS_KEY] = parent_tokens + [7] * PARENT_BLOCK
    request = RoutingRequest("c", "/v1/completions", {"prompt": state[TOKEN_IDS_KEY]}, meta)
    held = scorer.expected(request, state, None, engines)
    assert held[home.name].gpu_tokens == 0  # evicted: the index holds none of it
