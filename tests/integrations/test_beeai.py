"""A real BeeAI multi-agent workflow through the router: every call attributed, cache shared."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from beeai_framework.backend.message import UserMessage

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
    assert len(requests) == 5
    assert all(r["agent_id"] and r["agent_role"] for r in requests)
    agents = [r["agent_id"] for r in requests]
    assert (agents[0], agents[-1]) == ("planner", "reviewer")
    assert set(agents[1:4]) == {"executor-1", "executor-2", "executor-3"}
    assert {r["stage"] for r in requests} == {"plan", "execute", "review"}
    # agents after the planner found the shared brief already cached where the planner ran
    home = requests[0]["engine"]
    on_home = [r for r in requests[1:] if r["engine"] == home]
    assert on_home, "the router sent no later agent to the planner's engine"
    for r in on_home:
        assert r["cached_tokens"] > r["prompt_tokens"] // 2, r
    assert sum(a["cached_tokens"] for a in status["agents"] if a["id"] != "planner") > 0
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
