"""Concurrent agents with the official openai client, each call tagged by hiveroute.client.

A planner, then three executors in parallel (asyncio tasks), then a reviewer. Each agent runs
inside its own `workflow(...)` block, so the router sees who sent each call, and each call's
X-Parent-Request-Id is the answer it followed (the hand-offs).

    hiveroute serve --port 8080 &                 # embedded simulated engines
    python examples/openai_client.py --router http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid

from openai import AsyncOpenAI as PlainAsyncOpenAI

from hiveroute.client import AsyncOpenAI, workflow
from hiveroute.integrations.router_api import RouterAPIError, RouterClient

BRIEF = "\n".join(f"Requirement {i}: every agent must read the whole brief." for i in range(80))


async def run_agents(client: PlainAsyncOpenAI, model: str, workflow_id: str) -> None:
    async def ask(prompt: str) -> str:
        reply = await client.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": BRIEF}, {"role": "user", "content": prompt}],
            max_tokens=24,
        )
        return reply.choices[0].message.content or ""

    async with workflow(workflow_id, agent="planner", role="planner", stage="plan"):
        plan = await ask("Split the task into three steps.")

        async def executor(i: int) -> str:
            async with workflow(agent=f"executor-{i}", role="executor", stage="execute"):
                return await ask(f"Plan: {plan}\nDo step {i}.")

        results = await asyncio.gather(*(executor(i) for i in (1, 2, 3)))
        async with workflow(agent="reviewer", role="reviewer", stage="review"):
            await ask("Review:\n" + "\n".join(results))


async def main() -> int:
    parser = argparse.ArgumentParser(description="tagged openai client calls through hiveroute")
    parser.add_argument("--router", default="http://127.0.0.1:8080")
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    workflow_id = f"openai-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=args.router.rstrip("/") + "/v1", api_key="unused")
    async with RouterClient(args.router) as router:
        model = args.model or (await router.models())[0]
        await run_agents(client, model, workflow_id)
        try:
            status = await router.get_workflow(workflow_id)
        except RouterAPIError as exc:
            print(f"calls sent; the router has no workflow API here ({exc.message})")
            return 0
    print(f"workflow {workflow_id}")
    for request in status.get("requests", []):
        print(
            f"  {request.get('agent_id'):<11} parent={request.get('parent_request_id')} "
            f"cached={request.get('cached_tokens')}/{request.get('prompt_tokens')}"
        )
    print(json.dumps(status.get("totals", {}), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
