"""A BeeAI multi-agent workflow (planner -> executors -> reviewer) routed by hiveroute.

Every agent reads the same long project brief, so once the planner has run, the executors and
the reviewer find the brief's KV cache already on the engine hiveroute sends them to. Every
LLM call is tagged (workflow, agent, role, stage) by hiveroute's BeeAI middleware.

    hiveroute serve --port 8080 &                 # embedded simulated engines
    python examples/beeai_workflow.py --router http://127.0.0.1:8080

It prints the router's view of the workflow (GET /v1/workflows/{id}): every call attributed to
its agent, and the tokens each agent found cached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid

from beeai_framework.backend.chat import ChatModel
from beeai_framework.backend.message import SystemMessage, UserMessage
from beeai_framework.workflows import Workflow
from pydantic import BaseModel

from hiveroute.integrations.beeai import HiverouteMiddleware, router_chat_model
from hiveroute.integrations.router_api import RouterAPIError, RouterClient

TOPICS = ("routing", "caching", "scheduling", "telemetry", "failover", "capacity", "security")
PROJECT_BRIEF = "\n".join(
    f"Section {i}: the {TOPICS[i % len(TOPICS)]} requirements of the fleet, item {i}, "
    f"must hold for every tenant and every region, and be measured weekly."
    for i in range(60)
)


class TeamState(BaseModel):
    task: str
    plan: str = ""
    results: list[str] = []
    review: str = ""


def build_team_workflow(
    llm: ChatModel, *, executors: int = 3, max_tokens: int = 24
) -> Workflow[TeamState, str]:
    """planner -> `executors` executors in parallel -> reviewer, all over the same brief."""
    team: Workflow[TeamState, str] = Workflow(TeamState, name="team")

    def brief(instruction: str) -> list[SystemMessage | UserMessage]:
        return [SystemMessage(PROJECT_BRIEF), UserMessage(instruction)]

    async def plan(state: TeamState) -> str:
        output = await llm.run(
            brief(f"Split this task into {executors} steps: {state.task}"), max_tokens=max_tokens
        ).middleware(HiverouteMiddleware(agent="planner", role="planner", stage="plan"))
        state.plan = output.get_text_content()
        return "execute"

    async def execute(state: TeamState) -> str:
        async def step(i: int) -> str:
            output = await llm.run(
                brief(f"Plan: {state.plan}\nCarry out step {i + 1} of the plan."),
                max_tokens=max_tokens,
            ).middleware(
                HiverouteMiddleware(agent=f"executor-{i + 1}", role="executor", stage="execute")
            )
            return output.get_text_content()

        state.results = list(await asyncio.gather(*(step(i) for i in range(executors))))
        return "review"

    async def review(state: TeamState) -> str:
        report = "\n".join(f"Step {i + 1}: {r}" for i, r in enumerate(state.results))
        output = await llm.run(
            brief(f"Plan: {state.plan}\nResults:\n{report}\nReview the results."),
            max_tokens=max_tokens,
        ).middleware(HiverouteMiddleware(agent="reviewer", role="reviewer", stage="review"))
        state.review = output.get_text_content()
        return Workflow.END

    team.add_step("plan", plan)
    team.add_step("execute", execute)
    team.add_step("review", review)
    return team


async def run_team(
    router_url: str, model: str, *, workflow_id: str, task: str, executors: int = 3
) -> TeamState:
    """Run the team workflow once through the router, tagged as `workflow_id`."""
    llm = router_chat_model(router_url, model)
    team = build_team_workflow(llm, executors=executors)
    run = await team.run(TeamState(task=task)).middleware(
        HiverouteMiddleware(workflow_id=workflow_id)
    )
    return run.state


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--router", default="http://127.0.0.1:8080", help="the router's URL")
    parser.add_argument("--model", default=None, help="model name (default: the router's first)")
    parser.add_argument("--executors", type=int, default=3, help="how many executors")
    parser.add_argument("--workflow-id", default=None, help="workflow id (default: random)")
    args = parser.parse_args(argv)
    workflow_id = args.workflow_id or f"beeai-{uuid.uuid4().hex[:8]}"
    async with RouterClient(args.router) as router:
        model = args.model or (await router.models())[0]
        await run_team(
            args.router,
            model,
            workflow_id=workflow_id,
            task="cut time-to-first-token for agent workflows",
            executors=args.executors,
        )
        try:
            status = await router.get_workflow(workflow_id)
        except RouterAPIError as exc:
            print(f"workflow {workflow_id} ran; the router has no workflow API ({exc.message})")
            return 0
    print(f"workflow {workflow_id}")
    for agent in status.get("agents", []):
        print(
            f"  {agent.get('id'):<12} {agent.get('role') or '':<9} requests={agent.get('requests')}"
            f" prompt_tokens={agent.get('prompt_tokens')} cached_tokens={agent.get('cached_tokens')}"
            f" cross_agent_cached_tokens={agent.get('cross_agent_cached_tokens')}"
        )
    print(json.dumps(status.get("totals", {}), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
