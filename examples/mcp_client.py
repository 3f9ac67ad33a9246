"""An MCP host's view: spawn `hiveroute mcp` over stdio and call its tools with workflow _meta.

    hiveroute serve --port 8080 &                 # embedded simulated engines
    python examples/mcp_client.py --router http://127.0.0.1:8080

Against a running `hiveroute mcp --transport http --port 8090`, use
`mcp.client.streamable_http.streamable_http_client("http://127.0.0.1:8090/mcp")` instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


async def main() -> int:
    parser = argparse.ArgumentParser(description="drive hiveroute's MCP server over stdio")
    parser.add_argument("--router", default="http://127.0.0.1:8080")
    args = parser.parse_args()
    workflow_id = f"mcp-{uuid.uuid4().hex[:8]}"
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "hiveroute", "mcp", "--router", args.router]
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        print("tools:", [tool.name for tool in (await session.list_tools()).tools])
        meta = {"io.hiveroute/workflowId": workflow_id, "io.hiveroute/agentId": "planner",
                "io.hiveroute/agentRole": "planner", "io.hiveroute/stage": "plan"}  # fmt: skip
        spec = await session.call_tool(
            "register_context", {"text": "The spec. " * 200, "name": "spec"}, meta=meta
        )
        if spec.is_error:
            print("register_context failed:", spec.content)
        context_ids = [spec.structured_content["id"]] if spec.structured_content else []
        print("registered contexts:", context_ids)
        stages = {"planner": "plan", "executor-1": "execute", "reviewer": "review"}
        for agent, stage in stages.items():
            agent_meta = {
                **meta,
                "io.hiveroute/agentId": agent,
                "io.hiveroute/agentRole": agent.split("-")[0],
                "io.hiveroute/stage": stage,
            }
            result = await session.call_tool(
                "generate",
                {"prompt": f"{agent}: do your part", "context_ids": context_ids, "max_tokens": 16},
                meta=agent_meta,
            )
            if result.is_error:
                print(agent, "failed:", result.content)
            else:
                answer = result.structured_content or {}
                print(f"{agent:<11} request={answer.get('request_id')} usage={answer.get('usage')}")
        status = await session.call_tool("workflow_status", {"max_requests": 0}, meta=meta)
        if status.is_error:
            print("workflow_status failed:", status.content)
        else:
            data = status.structured_content or {}
            for agent in data.get("agents", []):
                print(
                    f"  {agent['id']:<11} cross_agent_cached_tokens={agent.get('cross_agent_cached_tokens')}"
                )
            print(json.dumps(data.get("totals"), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
