"""A real BeeAI multi-agent workflow through the router: every call attributed, cache shared."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from beeai_framework.agents.requirement import RequirementAgent
from beeai_framework.backend.message import UserMessage
from beeai_framework.backend.types import ChatModelParameters

from hiveroute.client import workflow
from hiveroute.integrations.beeai import HiverouteMiddleware, router_chat_model
from hiveroute.integrations.router_api import RouterClient
from tests.integrations.conftest import ApiStack

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "beeai_workflow.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("beeai_workflow_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def test_team_workflow_is_attributed_and_shares_cache(sim_api_stack: ApiStack) -> None:
    example = load_example()
    async with RouterClient(sim_api_stack.url) as router:
        model = (await router.models())[0]
        state = await example.run_team(
            sim_api_stack.url, model, workflow_id="bee-1", task="ship it", executors=3
        )
        status = await router.get_workflow("bee-1")
    assert len(state.results) == 3 and state.review
    requests = status["requests"]
    assert len(requests) == 5  # one call per agent
    # every LLM call of every agent was attributed: agent, role and stage
    assert all(r["agent_id"] and r["agent_role"] and r["stage"] for r in requests)
    names = {"planner", "executor-1", "executor-2", "executor-3", "reviewer"}
    assert {r["agent_id"] for r in requests} == names
    roles = {r["agent_id"]: r["agent_role"] for r in requests}
    assert roles["planner"] == "planner" and roles["executor-2"] == "executor"
    # the hand-offs are in order: plan, then execute, then review
    order = {"plan": 0, "execute": 1, "review": 2}
    stages = [order[r["stage"]] for r in requests]
    assert stages == sorted(stages)
    # agents after the planner found the shared brief already cached where the planner ran
    home = requests[0]["engine"]
    on_home = [r for r in requests if r["engine"] == home and r["agent_id"] != "planner"]
    assert on_home, "the router sent no later agent to the planner's engine"
    for r in on_home:
        assert r["cached_tokens"] > r["prompt_tokens"] // 2, r
    # and the router counts those hits as one agent reusing another's cache
    assert status["totals"]["cross_agent_cached_tokens"] > 0
    cross = {a["id"]: a["cross_agent_cached_tokens"] for a in status["agents"]}
    for r in on_home:
        assert cross[r["agent_id"]] > 0, (r["agent_id"], cross)
    assert cross["planner"] == 0
    # and the router saw nothing untagged
    assert all(m.workflow_id == "bee-1" for _, _, m in sim_api_stack.recorder.seen if m.agent_id)


async def test_workflow_id_defaults_to_the_beeai_group_id(sim_api_stack: ApiStack) -> None:
    llm = router_chat_model(sim_api_stack.url, "sim-model")
    middleware = HiverouteMiddleware(agent="solo", role="writer")
    await llm.run([UserMessage("hello")], max_tokens=4).middleware(middleware)
    _, _, metadata = sim_api_stack.recorder.seen[-1]
    assert metadata.workflow_id == middleware.last_workflow_id
    assert metadata.workflow_id and len(metadata.workflow_id) == 36  # BeeAI's uuid group id
    assert (metadata.agent_id, metadata.agent_role) == ("solo", "writer")


async def test_headers_configured_on_the_model_win(sim_api_stack: ApiStack) -> None:
    llm = router_chat_model(
        sim_api_stack.url, "sim-model", settings={"extra_headers": {"X-Agent-Role": "fixed"}}
    )
    await llm.run([UserMessage("hi")], max_tokens=4).middleware(
        HiverouteMiddleware(workflow_id="bee-2", agent="a", role="ignored", stage="s")
    )
    _, _, metadata = sim_api_stack.recorder.seen[-1]
    assert (metadata.workflow_id, metadata.agent_id, metadata.stage) == ("bee-2", "a", "s")
    assert metadata.agent_role == "fixed"


async def test_a_beeai_agent_tags_its_calls_with_its_own_name(sim_api_stack: ApiStack) -> None:
    llm = router_chat_model(
        sim_api_stack.url, "sim-model", parameters=ChatModelParameters(max_tokens=8)
    )
    middleware = HiverouteMiddleware(role="planner")
    agent = RequirementAgent(llm=llm, name="planner-agent", role="plans", middlewares=[middleware])
    # the simulator's text is no valid tool call, so the agent may retry; each call is tagged
    await agent.run("plan it", max_retries_per_step=0, total_max_retries=0)
    seen = [m for _, _, m in sim_api_stack.recorder.seen]
    assert seen
    for metadata in seen:
        assert (metadata.agent_id, metadata.agent_role) == ("planner-agent", "planner")
        assert metadata.workflow_id == middleware.last_workflow_id


async def test_an_enclosing_client_block_fills_what_the_middleware_leaves_out(
    sim_api_stack: ApiStack,
) -> None:
    llm = router_chat_model(sim_api_stack.url, "sim-model")
    async with workflow("wf-outer", session="s-1", agent="ignored"):
        await llm.run([UserMessage("hi")], max_tokens=4).middleware(
            HiverouteMiddleware(agent="inner")
        )
    _, _, metadata = sim_api_stack.recorder.seen[-1]
    assert (metadata.workflow_id, metadata.session_id, metadata.agent_id) == (
        "wf-outer",
        "s-1",
        "inner",
    )
