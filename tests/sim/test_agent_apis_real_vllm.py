"""The simulator builds the prompts of Responses and Messages requests as real vLLM 0.32 does.

Same requests to real vLLM (tiny model, stored responses on) and to the simulator with the tiny
model's tokenizer: the prompt token counts must be equal, so the KV blocks the router predicts
from hiveroute.protocols are the ones the engine computes.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hiveroute.engines.vllm_local import VllmServer, make_tiny_model, vllm_available
from hiveroute.sim import SimConfig, SimFleet

pytestmark = [
    pytest.mark.realvllm,
    pytest.mark.skipif(not vllm_available(), reason="real vLLM is not installed"),
]

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
RESPONSES = [
    {"input": "hello there agent", "instructions": "be brief"},
    {
        "input": [
            {"role": "developer", "content": "answer in one word"},
            {"role": "user", "content": [{"type": "input_text", "text": "call the tool"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
        "tools": TOOLS,
    },
    {
        "input": [
            {"role": "user", "content": "first"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok"}],
            },
            {"role": "user", "content": "second"},
        ]
    },
]
MESSAGES = [
    {"system": "be brief", "messages": [{"role": "user", "content": "hello"}]},
    {
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
            {"type": "text", "text": "you are "},
            {"type": "text", "text": "a coder", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"c": "x"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {"type": "text", "text": "and tomorrow?"},
                ],
            },
        ],
    },
]


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return make_tiny_model()


@pytest.fixture
async def real_vllm(tiny_dir: Path, tmp_path: Path) -> AsyncIterator[str]:
    previous = os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE")
    os.environ["VLLM_ENABLE_RESPONSES_API_STORE"] = "1"
    server = VllmServer(model_dir=tiny_dir, log_path=tmp_path / "vllm.log")
    try:
        server.start()
        await server.wait_ready()
        yield server.url
    finally:
        server.stop()
        if previous is None:
            os.environ.pop("VLLM_ENABLE_RESPONSES_API_STORE", None)
        else:
            os.environ["VLLM_ENABLE_RESPONSES_API_STORE"] = previous


async def _counts(url: str, model: str) -> list[Any]:
    counts: list[Any] = []
    async with aiohttp.ClientSession() as http:
        for body in RESPONSES:
            ask = {**body, "model": model, "max_output_tokens": 2}
            async with http.post(f"{url}/v1/responses", json=ask) as r:
                assert r.status == 200, await r.text()
                counts.append(("responses", (await r.json())["usage"]["input_tokens"]))
        for body in MESSAGES:
            ask = {**body, "model": model, "max_tokens": 2}
            async with http.post(f"{url}/v1/messages", json=ask) as r:
                assert r.status == 200, await r.text()
                usage = (await r.json())["usage"]
                total = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
                counts.append(("messages", total))
            async with http.post(f"{url}/v1/messages/count_tokens", json=ask) as r:
                counts.append(("count_tokens", (await r.json())["input_tokens"]))
    return counts


async def test_prompt_token_counts_equal_real_vllms(real_vllm: str, tiny_dir: Path) -> None:
    real = await _counts(real_vllm, "tiny")
    fleet = SimFleet(
        SimConfig(
            engines=1,
            base_port=0,
            events_base_port=0,
            preset="fast",
            tokenizer=str(tiny_dir),
            model="tiny",
            block_size=128,
        )
    )
    await fleet.start()
    try:
        simulated = await _counts(fleet.engines[0].url, "tiny")
    finally:
        await fleet.stop()
    assert simulated == real


async def test_a_responses_chain_and_a_messages_stream_through_the_router(
    real_vllm: str, tiny_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The router in front of real vLLM: a `previous_response_id` chain (recorded id -> engine,
    GET of the last id) with the openai SDK, and a Messages stream with the anthropic SDK,
    its usage counted from the last `message_delta`."""
    import logging

    import anthropic
    import openai

    from hiveroute.config import RouterConfig
    from hiveroute.server import start_router
    from tests.support.access import access_lines

    caplog.set_level(logging.INFO, logger="hiveroute.access")
    config = RouterConfig(
        engine=[real_vllm], host="127.0.0.1", port=0, tokenizer=str(tiny_dir)
    ).validate()
    running = await start_router(config)
    try:
        client = openai.AsyncOpenAI(base_url=running.url + "/v1", api_key="x", max_retries=0)
        previous = None
        for turn in ("my name is Ada", "what is my name?", "spell it"):
            response = await client.responses.create(
                model="tiny", input=turn, previous_response_id=previous, max_output_tokens=4
            )
            assert response.usage is not None and response.usage.input_tokens > 0
            previous = response.id
        assert previous is not None
        assert await running.router.response_ids.engine_of(None, previous) is not None
        got = await client.responses.retrieve(previous)
        assert got.id == previous
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(
                model="tiny", input="x", previous_response_id="resp_unknown", max_output_tokens=2
            )

        claude = anthropic.AsyncAnthropic(base_url=running.url, api_key="x", max_retries=0)
        kinds = []
        async with claude.messages.stream(
            model="tiny",
            max_tokens=4,
            system="be brief",
            messages=[{"role": "user", "content": "hello"}],
            extra_headers={"X-Request-Id": "real-msg"},
        ) as stream:
            async for event in stream:
                kinds.append(event.type)
            final = await stream.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        [line] = access_lines(caplog, "real-msg")
        whole = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
        assert line["prompt_tokens"] == whole > 0
        assert line["completion_tokens"] == final.usage.output_tokens
    finally:
        await running.stop()
