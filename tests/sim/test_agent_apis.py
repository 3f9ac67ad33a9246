"""The simulator's Responses and Messages APIs, through the official openai and anthropic SDKs.

Shapes are checked against what real vLLM 0.32 answered (tests/sim/fixtures, recorded with the
tiny model; see docs/protocols.md).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError

from tests.sim.conftest import FleetFactory

FIXTURE = json.loads((Path(__file__).parent / "fixtures/vllm_0_32_agent_apis.json").read_text())
PROMPT = "the planner writes a plan and the executor runs the tools " * 8


def _real(name: str) -> Any:
    return json.loads(FIXTURE[name]["body"])


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for block in text.strip().split("\n\n"):
        kind, data = block.split("\n", 1)
        assert kind.startswith("event: ") and data.startswith("data: ")
        found.append((kind[len("event: ") :], json.loads(data[len("data: ") :])))
    return found


def _collapse(kinds: list[str]) -> list[str]:
    """Event types with runs of deltas counted once (how many depends on the detokenizer)."""
    out: list[str] = []
    for kind in kinds:
        if not (out and out[-1] == kind and kind.endswith("delta")):
            out.append(kind)
    return out


def _openai(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)


async def test_responses_create_has_vllm_shape_and_usage(sim_fleet: FleetFactory) -> None:
    fleet = await sim_fleet()
    async with aiohttp.ClientSession() as http:
        body = {"input": "hello there agent", "instructions": "be brief", "max_output_tokens": 5}
        async with http.post(f"{fleet.engines[0].url}/v1/responses", json=body) as r:
            assert r.status == 200
            answer = await r.json()
    real = _real("responses_nonstream")
    assert set(answer) == set(real)
    assert set(answer["usage"]) == set(real["usage"])
    assert set(answer["usage"]["input_tokens_details"]) == set(
        real["usage"]["input_tokens_details"]
    )
    assert set(answer["output"][0]) == set(real["output"][0])
    assert answer["status"] == "incomplete" and answer["incomplete_details"] == {
        "reason": "max_output_tokens"
    }
    assert answer["usage"]["output_tokens"] == 5
    assert answer["id"].startswith("resp_") and answer["output"][0]["id"].startswith("msg_")


async def test_responses_sdk_chain_reuses_the_cache_and_lives_on_one_engine(
    sim_fleet: FleetFactory,
) -> None:
    fleet = await sim_fleet(engines=2)
    first_engine, other_engine = (_openai(e.url) for e in fleet.engines)
    first = await first_engine.responses.create(
        model="sim-model", instructions=PROMPT, input="plan the task", max_output_tokens=8
    )
    assert first.output_text and first.usage is not None
    assert first.usage.input_tokens_details.cached_tokens == 0
    second = await first_engine.responses.create(
        model="sim-model",
        input=[{"role": "user", "content": "now run step one"}],
        previous_response_id=first.id,
        instructions=PROMPT,
        max_output_tokens=8,
    )
    assert second.usage is not None and second.previous_response_id == first.id
    # The second prompt is the first conversation plus its answer plus the new turn.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= (first.usage.input_tokens // 16 - 1) * 16 > 0
    fetched = await first_engine.responses.retrieve(second.id)
    assert fetched.id == second.id and fetched.output_text == second.output_text
    # Stored on the engine that made it only: another engine answers vLLM's 404.
    with pytest.raises(NotFoundError) as info:
        await other_engine.responses.create(
            model="sim-model", input="go on", previous_response_id=second.id
        )
    assert info.value.body == {
        "message": f"Response with id '{second.id}' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }
    with pytest.raises(NotFoundError):
        await other_engine.responses.retrieve(second.id)
    await first_engine.close()
    await other_engine.close()


async def test_responses_stream_sends_vllms_typed_events(sim_fleet: FleetFactory) -> None:
    fleet = await sim_fleet()
    async with aiohttp.ClientSession() as http:
        body = {"input": "hello stream", "max_output_tokens": 4, "stream": True}
        async with http.post(f"{fleet.engines[0].url}/v1/responses", json=body) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            events = _events(await r.text())
    real = _events(FIXTURE["responses_stream"]["body"])
    assert _collapse([k for k, _ in events]) == _collapse([k for k, _ in real])
    for (kind, data), (real_kind, real_data) in zip(events, real, strict=False):
        assert data["type"] == kind
        if kind == real_kind:
            assert set(data) == set(real_data), kind
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    done = events[-1][1]["response"]
    deltas = "".join(d["delta"] for k, d in events if k == "response.output_text.delta")
    assert done["output"][0]["content"][0]["text"] == deltas
    assert done["usage"]["output_tokens"] == 4


async def test_responses_sdk_stream_and_stored_answer_agree(sim_fleet: FleetFactory) -> None:
    fleet = await sim_fleet()
    client = _openai(fleet.engines[0].url)
    stream = await client.responses.create(
        model="sim-model", input=PROMPT, max_output_tokens=6, stream=True
    )
    kinds = []
    final = None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.completed":
            final = event.response
    assert kinds[0] == "response.created" and final is not None
    stored = await client.responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.usage == final.usage
    await client.close()


async def test_responses_background_cancel_and_errors(sim_fleet: FleetFactory) -> None:
    fleet = await sim_fleet(time_scale=5.0)  # slow steps: the background request still runs
    url = fleet.engines[0].url
    client = _openai(url)
    done = await client.responses.create(model="sim-model", input="x", max_output_tokens=2)
    with pytest.raises(BadRequestError) as info:
        await client.responses.cancel(done.id)
    assert "Cannot cancel a synchronous response." in str(info.value)
    queued = await client.responses.create(
        model="sim-model", input=PROMPT, max_output_tokens=2000, background=True
    )
    assert queued.status == "queued" and queued.background
    cancelled = await client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert (await client.responses.retrieve(queued.id)).status == "cancelled"
    with pytest.raises(NotFoundError):
        await client.responses.cancel("resp_nope")
    not_kept = await client.responses.create(
        model="sim-model", input="x", max_output_tokens=2, store=False
    )
    with pytest.raises(NotFoundError):
        await client.responses.retrieve(not_kept.id)
    await client.close()
    async with aiohttp.ClientSession() as http:
        for payload, param in [
            (b"{not json", None),
            (json.dumps({"input": 5}).encode(), "input"),
            (json.dumps({"input": [{"type": "web_search_call"}]}).encode(), "input"),
            (json.dumps({"input": "x", "max_output_tokens": "many"}).encode(), "max_output_tokens"),
            (
                json.dumps({"input": "x", "previous_response_id": 7}).encode(),
                "previous_response_id",
            ),
            (json.dumps({"input": "x", "model": "other"}).encode(), "model"),
        ]:
            async with http.post(f"{url}/v1/responses", data=payload) as r:
                error = (await r.json())["error"]
                assert 400 <= r.status < 500, payload
                assert error["code"] == r.status and error["message"]
                if param is not None:
                    assert error["param"] == param, payload


def _anthropic(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0)


async def test_messages_sdk_usage_counts_cache_reads_as_vllm_does(
    sim_fleet: FleetFactory,
) -> None:
    fleet = await sim_fleet()
    client = _anthropic(fleet.engines[0].url)
    ask = {
        "model": "sim-model",
        "max_tokens": 5,
        "system": [{"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hello"}],
        "metadata": {"user_id": "u1"},
    }
    first = await client.messages.create(**ask)
    second = await client.messages.create(**ask)
    assert first.type == "message" and first.content[0].type == "text"
    assert first.stop_reason == "max_tokens" and first.usage.output_tokens == 5
    assert first.usage.cache_read_input_tokens == 0
    read = second.usage.cache_read_input_tokens
    assert read is not None and read > 0
    # vLLM's rule: input_tokens is the prompt less what was read from the cache.
    assert second.usage.input_tokens + read == first.usage.input_tokens
    count = await client.messages.count_tokens(
        model="sim-model", system=ask["system"], messages=ask["messages"]
    )
    assert count.input_tokens == first.usage.input_tokens
    await client.close()
    async with aiohttp.ClientSession() as http:
        body = {**ask, "system": "be brief"}
        async with http.post(f"{fleet.engines[0].url}/v1/messages", json=body) as r:
            answer = await r.json()
    real = _real("messages_nonstream")
    assert set(answer) == set(real) and set(answer["usage"]) == set(real["usage"])


async def test_messages_stream_sends_anthropics_events(sim_fleet: FleetFactory) -> None:
    fleet = await sim_fleet()
    async with aiohttp.ClientSession() as http:
        body = {
            "model": "sim-model",
            "max_tokens": 5,
            "stream": True,
            "system": "be brief",
            "messages": [{"role": "user", "content": "hello"}],
        }
        async with http.post(f"{fleet.engines[0].url}/v1/messages", json=body) as r:
            events = _events(await r.text())
    real = _events(FIXTURE["messages_stream"]["body"])
    assert _collapse([k for k, _ in events]) == _collapse([k for k, _ in real])
    real_by_kind = {k: d for k, d in real}
    for kind, data in events:
        assert data["type"] == kind and set(data) == set(real_by_kind[kind]), kind
    assert set(events[0][1]["message"]) == set(real_by_kind["message_start"]["message"])
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == "max_tokens" and final["usage"]["output_tokens"] == 5
    client = _anthropic(fleet.engines[0].url)
    async with client.messages.stream(
        model="sim-model", max_tokens=6, messages=[{"role": "user", "content": PROMPT}]
    ) as stream:
        text = "".join([t async for t in stream.text_stream])
        message = await stream.get_final_message()
    assert text and message.content[0].type == "text" and message.content[0].text == text
    assert message.usage.output_tokens == 6
    await client.close()


async def test_messages_tool_results_and_errors_in_anthropics_shape(
    sim_fleet: FleetFactory,
) -> None:
    fleet = await sim_fleet()
    client = _anthropic(fleet.engines[0].url)
    answer = await client.messages.create(
        model="sim-model",
        max_tokens=3,
        tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"c": 1}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}],
            },
        ],
    )
    assert answer.usage.output_tokens == 3
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.messages.create(
            model="other", max_tokens=3, messages=[{"role": "user", "content": "x"}]
        )
    assert missing.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "The model `other` does not exist."},
    }
    await client.close()
    async with aiohttp.ClientSession() as http:
        both = ("/v1/messages", "/v1/messages/count_tokens")
        create = ("/v1/messages",)
        for payload, paths in [
            (b"{not json", both),
            (b"[1, 2]", both),
            ({"messages": [{"role": "user", "content": "x"}]}, create),
            ({"max_tokens": 3, "messages": "x"}, both),
            ({"max_tokens": 3, "messages": [{"role": "robot", "content": "x"}]}, both),
            ({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, create),
            ({"max_tokens": 3, "system": 5, "messages": [{"role": "user", "content": "x"}]}, both),
            ({"max_tokens": 3, "messages": [{"role": "user", "content": "x " * 20000}]}, create),
        ]:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            for path in paths:
                async with http.post(f"{fleet.engines[0].url}{path}", data=data) as r:
                    body = await r.json()
                    assert 400 <= r.status < 500, (path, payload)
                    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
                    assert body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"input": PROMPT, "max_output_tokens": 1000, "stream": True}),
        (
            "/v1/messages",
            {"max_tokens": 1000, "stream": True, "messages": [{"role": "user", "content": PROMPT}]},
        ),
    ],
)
async def test_a_client_that_leaves_a_stream_frees_its_blocks(
    sim_fleet: FleetFactory, path: str, body: dict[str, Any]
) -> None:
    fleet = await sim_fleet(time_scale=5.0)  # slow steps, so the request is still running
    engine = fleet.engines[0]
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{engine.url}{path}", json=body)
        await resp.content.readline()  # the first event arrived: the request holds blocks
        assert engine.scheduler.running and engine.pool.usage() > 0
        resp.close()
        for _ in range(100):
            if not engine.scheduler.running:
                break
            await asyncio.sleep(0.02)
    assert not engine.scheduler.running and engine.pool.usage() == 0.0


async def test_fault_knobs_answer_in_each_apis_shape(sim_fleet: FleetFactory) -> None:
    fleet = await sim_fleet()
    engine = fleet.engines[0]
    engine.faults.update({"fail_fraction": 1.0, "fail_status": 503})
    async with aiohttp.ClientSession() as http:
        ask = {"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
        async with http.post(f"{engine.url}/v1/messages", json=ask) as r:
            assert r.status == 503
            assert (await r.json())["error"]["type"] == "overloaded_error"
        async with http.post(f"{engine.url}/v1/responses", json={"input": "x"}) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == 503
