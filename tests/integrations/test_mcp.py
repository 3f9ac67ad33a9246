"""`hiveroute mcp`, driven by the official MCP SDK client over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import hiveroute
from hiveroute.integrations.mcp_server import routing_headers, routing_tags
from hiveroute.integrations.tags import WorkflowTags
from tests.integrations.conftest import ApiStack

ROOT = str(Path(hiveroute.__file__).resolve().parent.parent)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TOOLS = {"generate", "register_context", "get_context", "workflow_status"}


def server_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT}


@contextlib.asynccontextmanager
async def stdio_session(router_url: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "hiveroute", "mcp", "--transport", "stdio", "--router", router_url],
        env=server_env(),
        cwd=ROOT,
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def http_server(router_url: str, *extra: str) -> AsyncIterator[str]:
    """`hiveroute mcp --transport http --port 0` in a subprocess; yields its MCP URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hiveroute",
        "mcp",
        "--transport",
        "http",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--router",
        router_url,
        *extra,
        env=server_env(),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        url = None
        async with asyncio.timeout(60):
            while url is None:
                line = (await process.stderr.readline()).decode()
                assert line, "hiveroute mcp exited before listening"
                match = re.search(r"(http://\S+/mcp)", line)
                url = match.group(1) if match else None
        yield url
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    data = result.structured_content
    assert isinstance(data, dict)
    return data


def error_text(result: Any) -> str:
    assert result.is_error
    return " ".join(getattr(c, "text", "") for c in result.content)


async def test_stdio_tools_carry_the_hosts_workflow(api_stack: ApiStack) -> None:
    meta = {
        "io.hiveroute/workflowId": "wf-mcp",
        "io.hiveroute/agentId": "planner",
        "io.hiveroute/agentRole": "planner",
        "io.hiveroute/stage": "plan",
        "traceparent": TRACEPARENT,
        "baggage": "session.id=s-9",
    }
    async with stdio_session(api_stack.url) as session:
        tools = await session.list_tools()
        assert {t.name for t in tools.tools} == TOOLS

        registered = structured(
            await session.call_tool(
                "register_context",
                {"text": "THE SHARED SPEC " * 20, "id": "spec", "name": "spec"},
                meta=meta,
            )
        )
        assert registered["id"] == "spec" and registered["workflow_id"] == "wf-mcp"

        answer = structured(
            await session.call_tool(
                "generate",
                {"prompt": "write the plan", "model": "m", "context_ids": ["spec"]},
                meta=meta,
            )
        )
        engines = {e.url.removeprefix("http://"): e for e in api_stack.engines}
        assert answer["request_id"] and answer["engine"] in engines
        assert answer["workflow_id"] == "wf-mcp" and answer["usage"]["prompt_tokens"] == 10

        status = structured(
            await session.call_tool(
                "workflow_status", {}, meta={"io.hiveroute/workflowId": "wf-mcp"}
            )
        )
        assert status["id"] == "wf-mcp"
        [request] = status["requests"]
        assert request["request_id"] == answer["request_id"]
        assert (request["agent_id"], request["agent_role"]) == ("planner", "planner")

        fetched = structured(await session.call_tool("get_context", {"id": "spec"}))
        assert fetched["text"].startswith("THE SHARED SPEC")

        resources = await session.list_resources()
        assert "hiveroute://contexts/spec" in {str(r.uri) for r in resources.resources}
        read = await session.read_resource("hiveroute://contexts/spec")
        assert read.contents[0].text.startswith("THE SHARED SPEC")  # type: ignore[union-attr]

    _, _, metadata = api_stack.recorder.seen[-1]
    assert (metadata.workflow_id, metadata.agent_id, metadata.stage) == (
        "wf-mcp",
        "planner",
        "plan",
    )
    assert metadata.session_id == "s-9"  # from the forwarded W3C baggage
    engine = engines[answer["engine"]]
    # the generation carries the host's trace (a pre-warm of the context, sent in the
    # background, may reach the engine after it)
    assert TRACEPARENT in {h.get("traceparent") for h in engine.received_headers}
    sent = json.dumps(engine.received[-1])
    assert "THE SHARED SPEC" in sent and "write the plan" in sent


async def test_stdio_errors_are_tool_errors(api_stack: ApiStack) -> None:
    async with stdio_session(api_stack.url) as session:
        both = await session.call_tool(
            "generate", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}
        )
        assert "exactly one" in error_text(both)
        big = await session.call_tool("generate", {"prompt": "a", "max_tokens": 0})
        assert "max_tokens" in error_text(big)
        missing = await session.call_tool("get_context", {"id": "nope"})
        assert "404" in error_text(missing)
        no_wf = await session.call_tool("workflow_status", {})
        assert "workflow_id" in error_text(no_wf)
        bad_meta = await session.call_tool(
            "generate", {"prompt": "a"}, meta={"io.hiveroute/agentId": 5}
        )
        assert "_meta" in error_text(bad_meta)
        # no model anywhere: the router's first model is used
        assert structured(await session.call_tool("generate", {"prompt": "a"}))["model"] == "m"
        with pytest.raises(MCPError, match="nope"):
            await session.read_resource("hiveroute://contexts/nope")


async def test_unreachable_router_is_a_clear_tool_error() -> None:
    async with stdio_session("http://127.0.0.1:9") as session:
        result = await session.call_tool("generate", {"prompt": "a", "model": "m"})
        assert "cannot reach the router" in error_text(result)


async def test_streamable_http_arguments_override_meta(api_stack: ApiStack) -> None:
    async with (
        http_server(api_stack.url, "--model", "m") as url,
        streamable_http_client(url) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        assert {t.name for t in (await session.list_tools()).tools} == TOOLS
        answer = structured(
            await session.call_tool(
                "generate",
                {
                    "messages": [{"role": "user", "content": "execute step 1"}],
                    "agent_id": "executor-1",
                    "agent_role": "executor",
                },
                meta={"io.hiveroute/workflowId": "wf-http", "io.hiveroute/agentId": "host"},
            )
        )
        assert answer["model"] == "m"
        status = structured(await session.call_tool("workflow_status", {"workflow_id": "wf-http"}))
        assert [r["agent_id"] for r in status["requests"]] == ["executor-1"]
    _, body, metadata = api_stack.recorder.seen[-1]
    assert (metadata.workflow_id, metadata.agent_id, metadata.agent_role) == (
        "wf-http",
        "executor-1",
        "executor",
    )
    assert body["messages"][-1]["content"] == "execute step 1"


def test_meta_mapping() -> None:
    tags = routing_tags(
        {"io.hiveroute/workflowId": "w", "io.hiveroute/agentId": "a", "baggage": "agent.role=r"},
        WorkflowTags(agent_id="b"),
    )
    assert (tags.workflow_id, tags.agent_id, tags.agent_role) == ("w", "b", "r")
    headers = routing_headers({"traceparent": TRACEPARENT, "baggage": "k=v"}, tags)
    assert headers["traceparent"] == TRACEPARENT
    assert headers["X-Workflow-Id"] == "w" and headers["X-Agent-Id"] == "b"
    assert headers["baggage"].startswith("k=v,")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--router", "ftp://x"], {}, "--router"),
        ([], {"HIVEROUTE_MCP_ROUTER": "ftp://x"}, "http://"),
        (["--transport", "sse"], {}, "--transport must be stdio or http"),
        (["--transport", "http"], {"HIVEROUTE_MCP_PORT": "abc"}, "--port must be a number"),
        (["--port", "70000"], {}, "--port must be 0..65535"),
        (["--timeout-s", "0"], {}, "--timeout-s must be positive"),
        (["--log-level", "loud"], {}, "--log-level"),
    ],
)
def test_cli_refuses_bad_settings(argv: list[str], env: dict[str, str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hiveroute", "mcp", *argv],
        env={**server_env(), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stderr


def test_cli_reports_a_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "hiveroute", "mcp", "--transport", "http", "--port", str(port)],
            env=server_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
