"""The agent APIs through the router, with the official SDKs, over the simulator.

`openai` (Responses: create streamed and not, a `previous_response_id` chain over two engines
and two router replicas sharing Redis, GET, cancel), `anthropic` (Messages streamed and not,
count_tokens, `x-api-key`), and an OpenAI Agents SDK agent with one function tool. Usage is
counted from each API's own fields, streamed or not.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from hiveroute.bench.redis_server import RedisServer
from hiveroute.protocols.anthropic import cache_control_prefix
from hiveroute.sim import SimFleet
from tests.conftest import RouterFactory
from tests.sim.conftest import FleetFactory, urls
from tests.support.access import access_lines

ENGINE = "X-Hiveroute-Engine"


def openai_client(url: str, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=kw.pop("key", "unused"), max_retries=0)


def anthropic_client(url: str, key: str = "unused") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)


async def two_engines(sim_fleet: FleetFactory) -> SimFleet:
    return await sim_fleet(engines=2)


async def test_responses_streamed_and_not_with_usage_counted(
    sim_fleet: FleetFactory, router_factory: RouterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hiveroute.access")
    fleet = await sim_fleet()
    model = fleet.config.model_name()
    r = await router_factory(urls(fleet))
    client = openai_client(r.url)
    raw = await client.responses.with_raw_response.create(
        model=model, input="hello there", instructions="be brief", max_output_tokens=8,
        extra_headers={"X-Request-Id": "resp-1"},
    )  # fmt: skip
    response = raw.parse()
    assert response.status in ("completed", "incomplete") and response.output_text
    [line] = access_lines(caplog, "resp-1")
    assert line["prompt_tokens"] == response.usage.input_tokens > 0
    assert line["completion_tokens"] == response.usage.output_tokens > 0

    kinds = []
    stream = await client.responses.create(
        model=model, input="hello there", instructions="be brief", max_output_tokens=8,
        stream=True, extra_headers={"X-Request-Id": "resp-2"},
    )  # fmt: skip
    final = None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.completed":
            final = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    assert final is not None and final.usage is not None
    [line] = access_lines(caplog, "resp-2")
    assert line["prompt_tokens"] == final.usage.input_tokens
    assert line["cached_tokens"] == final.usage.input_tokens_details.cached_tokens > 0
    assert line["ttft_ms"] is not None


async def test_a_previous_response_id_chain_stays_on_its_engine_through_two_replicas(
    sim_fleet: FleetFactory, router_factory: RouterFactory, redis_server: RedisServer
) -> None:
    fleet = await two_engines(sim_fleet)
    model = fleet.config.model_name()
    options = {"policy": "round_robin", "state": redis_server.url + "?timeout_s=5"}
    a = await router_factory(urls(fleet), **options)
    b = await router_factory(urls(fleet), **options)
    clients = [openai_client(a.url), openai_client(b.url)]
    first = await clients[0].responses.with_raw_response.create(
        model=model, input="remember the number 7", max_output_tokens=4
    )
    home = first.headers[ENGINE]
    previous = first.parse().id
    for turn in range(4):  # round robin would alternate; the stored response pins the engine
        client = clients[(turn + 1) % 2]
        stream = turn % 2 == 1
        if stream:
            async with client.responses.with_streaming_response.create(
                model=model, input=f"turn {turn}", previous_response_id=previous,
                max_output_tokens=4, stream=True,
            ) as raw_stream:  # fmt: skip
                assert raw_stream.headers[ENGINE] == home
                async for event in await raw_stream.parse():
                    if event.type == "response.completed":
                        previous = event.response.id
        else:
            raw = await client.responses.with_raw_response.create(
                model=model, input=f"turn {turn}", previous_response_id=previous,
                max_output_tokens=4,
            )  # fmt: skip
            assert raw.headers[ENGINE] == home
            previous = raw.parse().id
    # GET through either replica reaches the engine that stored it
    got = await clients[1].responses.with_raw_response.retrieve(previous)
    assert got.headers[ENGINE] == home and got.parse().id == previous
    # an id nobody stored: 404 in OpenAI's shape naming it
    with pytest.raises(openai.NotFoundError) as missing:
        await clients[0].responses.create(
            model=model, input="x", previous_response_id="resp_nothere", max_output_tokens=2
        )
    assert "resp_nothere" in str(missing.value)
    with pytest.raises(openai.NotFoundError):
        await clients[1].responses.retrieve("resp_nothere")
    # its engine gone from the pool: a 4xx that says so, not another engine's 404
    a.router.pool.remove(home)
    with pytest.raises(openai.APIStatusError) as gone:
        await clients[0].responses.create(
            model=model, input="x", previous_response_id=previous, max_output_tokens=2
        )
    assert gone.value.status_code == 410
    assert home in str(gone.value) and "left the pool" in str(gone.value)


async def test_cancel_a_background_response_on_its_engine(
    sim_fleet: FleetFactory, router_factory: RouterFactory
) -> None:
    fleet = await two_engines(sim_fleet)
    model = fleet.config.model_name()
    r = await router_factory(urls(fleet), policy="round_robin")
    client = openai_client(r.url)
    started = await client.responses.with_raw_response.create(
        model=model, input="a long essay", max_output_tokens=2000, background=True
    )
    home, response = started.headers[ENGINE], started.parse()
    assert response.status in ("queued", "in_progress")
    cancelled = await client.responses.with_raw_response.cancel(response.id)
    assert cancelled.headers[ENGINE] == home
    assert cancelled.parse().status == "cancelled"
    done = await client.responses.create(model=model, input="short", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):  # a synchronous response cannot be cancelled
        await client.responses.cancel(done.id)


async def test_messages_streamed_and_not_and_count_tokens(
    sim_fleet: FleetFactory, router_factory: RouterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hiveroute.access")
    fleet = await sim_fleet()
    model = fleet.config.model_name()
    r = await router_factory(urls(fleet))
    client = anthropic_client(r.url)
    system = [{"type": "text", "text": "You are terse. " * 20}]
    messages: list[Any] = [{"role": "user", "content": "hello"}]
    message = await client.messages.create(
        model=model, max_tokens=8, system=system, messages=messages,
        extra_headers={"X-Request-Id": "msg-1"},
    )  # fmt: skip
    assert message.type == "message" and message.content[0].type == "text"
    [line] = access_lines(caplog, "msg-1")
    usage = message.usage
    whole = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert line["prompt_tokens"] == whole and line["completion_tokens"] == usage.output_tokens

    kinds = []
    async with client.messages.stream(
        model=model, max_tokens=8, system="You are terse. " * 20, messages=messages,
        extra_headers={"X-Request-Id": "msg-2"},
    ) as stream:  # fmt: skip
        async for event in stream:
            kinds.append(event.type)
        final = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    [line] = access_lines(caplog, "msg-2")
    read = final.usage.cache_read_input_tokens
    assert read and line["cached_tokens"] == read > 0  # the second time, the prefix is cached
    assert line["prompt_tokens"] == final.usage.input_tokens + read

    counted = await client.messages.count_tokens(model=model, system=system, messages=messages)
    assert counted.input_tokens == whole


async def test_messages_with_x_api_key_and_refusals_in_anthropic_shape(
    sim_fleet: FleetFactory, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    model = fleet.config.model_name()
    r = await router_factory(urls(fleet), api_keys={"sk-team-key": "team"})
    ok = await anthropic_client(r.url, "sk-team-key").messages.create(
        model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )
    assert ok.content
    with pytest.raises(anthropic.AuthenticationError) as denied:
        await anthropic_client(r.url, "sk-wrong-key").messages.create(
            model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        await anthropic_client(r.url, "sk-team-key").messages.create(
            model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )


async def test_an_agents_sdk_agent_with_a_function_tool_runs_to_completion(
    sim_fleet: FleetFactory, router_factory: RouterFactory
) -> None:
    agents = pytest.importorskip("agents")  # openai-agents, in the test extra
    agents.set_tracing_disabled(True)
    fleet = await sim_fleet()
    model = fleet.config.model_name()
    r = await router_factory(urls(fleet))

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    agent = agents.Agent(
        name="adder",
        instructions="Use the add tool when asked to add.",
        tools=[add],
        model=agents.OpenAIResponsesModel(model=model, openai_client=openai_client(r.url)),
    )  # no max_tokens: the simulator then ends its answer (a limit would end it `incomplete`)
    result = await agents.Runner.run(agent, "What is 2 + 3?", max_turns=3)
    assert isinstance(result.final_output, str)
    assert result.raw_responses and all(
        resp.usage.input_tokens > 0 for resp in result.raw_responses
    )


def test_the_prefix_up_to_the_last_cache_control_block_and_its_ttl() -> None:
    system = [
        {"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "more"},
    ]
    body: dict[str, Any] = {"model": "m", "max_tokens": 9, "system": system, "messages": []}
    prefix, ttl = cache_control_prefix(body) or ({}, 0.0)
    assert ttl == 300.0 and prefix["system"] == system[:1] and prefix["max_tokens"] == 1
    turn = [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        {"type": "text", "text": "c"},
    ]
    body["messages"] = [{"role": "user", "content": "q"}, {"role": "user", "content": turn}]
    prefix, ttl = cache_control_prefix(body) or ({}, 0.0)
    assert ttl == 3600.0 and prefix["messages"][-1]["content"] == turn[:2]
    assert prefix["system"] == system and prefix["messages"][0] == body["messages"][0]
    assert cache_control_prefix({"messages": [{"role": "user", "content": "q"}]}) is None


async def test_a_cache_control_prefix_is_kept_warm_on_the_engine_that_served_it(
    sim_fleet: FleetFactory, router_factory: RouterFactory
) -> None:
    fleet = await two_engines(sim_fleet)
    model = fleet.config.model_name()
    r = await router_factory(
        urls(fleet), keep_warm_idle_s=1.0, keep_warm_interval_s=3600
    )  # the test runs the rounds
    client = anthropic_client(r.url)
    raw = await client.messages.with_raw_response.create(
        model=model, max_tokens=4,
        system=[{"type": "text", "text": "long rules " * 50, "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "hi"}],
    )  # fmt: skip
    served = raw.headers[ENGINE]
    keep_warm = r.router.workflows.keep_warm
    [hint] = keep_warm.hints.values()
    assert hint.engine == served and hint.until - hint.last == pytest.approx(300.0)
    assert keep_warm.round(now=hint.last + 0.5) == 0  # not idle yet
    assert keep_warm.round(now=hint.last + 2.0) == 1  # idle: touched on its engine
    await keep_warm.drain()
    assert (
        r.router.metrics.registry.get_sample_value(
            "hiveroute_keep_warm_requests_total",
            {"engine": served, "kind": "cache_control", "result": "ok"},
        )
        == 1.0
    )
    assert keep_warm.round(now=hint.last + 301.0) == 0 and not keep_warm.hints  # TTL over


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
async def test_a_client_leaving_a_stream_aborts_it_on_the_engine(
    path: str, sim_fleet: FleetFactory, router_factory: RouterFactory
) -> None:
    fleet = await sim_fleet(time_scale=5.0)  # slow steps, so the request is still running
    engine = fleet.engines[0]
    model = fleet.config.model_name()
    r = await router_factory(urls(fleet))
    body: dict[str, Any] = {"model": model, "stream": True}
    if path == "/v1/responses":
        body.update(input="write a long essay", max_output_tokens=1000)
    else:
        body.update(messages=[{"role": "user", "content": "write"}], max_tokens=1000)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(r.url + path, json=body)
        await resp.content.readline()  # the stream began: the request runs on the engine
        assert engine.scheduler.running
        resp.close()
    for _ in range(200):
        if not engine.scheduler.running:
            break
        await asyncio.sleep(0.02)
    assert not engine.scheduler.running and engine.pool.usage() == 0.0


async def test_a_client_gone_while_its_answer_is_recorded_leaves_nothing_in_flight(
    sim_fleet: FleetFactory, router_factory: RouterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A streamed Responses answer is recorded (its id -> engine) before it is relayed. A
    client that goes away while that write waits cancels the handler there: the engine must
    stop counting the request in flight, or it looks busier for good."""
    from hiveroute.gateway.response_ids import ResponseIds

    recording = asyncio.Event()

    async def store_that_never_answers(
        self: Any, tenant: Any, response_id: str, engine: str
    ) -> None:
        recording.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(ResponseIds, "record", store_that_never_answers)
    fleet = await sim_fleet(engines=1)
    r = await router_factory(urls(fleet))
    [engine] = r.router.pool.engines
    body = {
        "model": fleet.config.model_name(),
        "input": "hi",
        "stream": True,
        "max_output_tokens": 4,
    }

    async def client() -> None:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{r.url}/v1/responses", json=body) as response,
        ):
            await response.read()

    task = asyncio.create_task(client())
    await asyncio.wait_for(recording.wait(), 60)
    assert engine.load.in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(1000):  # the router hears the closed connection on its next loop turns
        if engine.load.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.load.in_flight == 0


async def test_a_messages_request_may_reference_a_shared_context(
    sim_fleet: FleetFactory, router_factory: RouterFactory
) -> None:
    """`hiveroute.context_refs` on a Messages request: the context opens its `system` (it was
    refused with a 400, 'shared contexts need a text prompt')."""
    fleet = await sim_fleet()
    r = await router_factory(urls(fleet))
    async with aiohttp.ClientSession() as http:
        context = {"id": "kb", "text": "the knowledge base every agent reads " * 20}
        async with http.post(f"{r.url}/v1/contexts", json=context) as registered:
            assert registered.status == 201
    client = anthropic_client(r.url)
    message = await client.messages.create(
        model=fleet.config.model_name(), max_tokens=8, system="be brief",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"hiveroute": {"context_refs": ["kb"]}},
    )  # fmt: skip
    assert message.content and message.usage.input_tokens > 100  # the context was read
