"""vLLM's OpenAI API shapes over real HTTP, accepted by the official openai client."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import weakref
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError

from hiveroute.engines.prom_text import info_labels, parse_prometheus_text
from hiveroute.sim.engine import RequestHandle
from hiveroute.sim.intake import INTAKE_MAX_WAIT
from tests.sim.conftest import FleetFactory

PROMPT = "the planner writes a plan and the executor runs the tools " * 6


async def _metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    return parse_prometheus_text(await (await session.get(f"{url}/metrics")).text())


async def test_openai_client_completions_and_cached_tokens(sim_fleet: FleetFactory) -> None:
    fleet = await sim_fleet()
    client = AsyncOpenAI(base_url=f"{fleet.engines[0].url}/v1", api_key="x", max_retries=0)
    first = await client.completions.create(model="sim-model", prompt=PROMPT, max_tokens=5)
    second = await client.completions.create(model="sim-model", prompt=PROMPT, max_tokens=5)
    assert first.choices[0].finish_reason == "length" and first.choices[0].text
    assert first.usage is not None and second.usage is not None
    assert first.usage.completion_tokens == 5
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details
    assert cached is not None
    # vLLM's rule: every full block before the last prompt token is a hit.
    assert cached.cached_tokens == (first.usage.prompt_tokens - 1) // 16 * 16
    models = await client.models.list()
    assert [m.id for m in models.data] == ["sim-model"]
    await client.close()


async def test_openai_client_chat_streamed_with_usage(sim_fleet: FleetFactory) -> None:
    fleet = await sim_fleet()
    client = AsyncOpenAI(base_url=f"{fleet.engines[0].url}/v1", api_key="x", max_retries=0)
    messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "go"}]
    stream = await client.chat.completions.create(
        model="sim-model",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == ["length"] and text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    plain = await client.chat.completions.create(model="sim-model", messages=messages, max_tokens=6)  # type: ignore[arg-type]
    assert plain.choices[0].message.content == text
    assert plain.usage is not None and plain.usage.prompt_tokens == chunks[-1].usage.prompt_tokens
    await client.close()


async def test_stream_without_include_usage_has_no_usage_chunk(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    body = {"prompt": "hello there", "max_tokens": 3, "stream": True}
    resp = await session.post(f"{fleet.engines[0].url}/v1/completions", json=body)
    lines = [ln for ln in (await resp.text()).split("\n\n") if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert len(chunks) == 3 and all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_errors_have_vllm_messages_and_openai_shape(sim_fleet: FleetFactory) -> None:
    fleet = await sim_fleet(max_model_len=64)
    client = AsyncOpenAI(base_url=f"{fleet.engines[0].url}/v1", api_key="x", max_retries=0)
    with pytest.raises(NotFoundError, match="does not exist"):
        await client.completions.create(model="nope", prompt="x", max_tokens=1)
    with pytest.raises(BadRequestError, match="maximum context length"):
        await client.completions.create(model="sim-model", prompt=PROMPT * 3, max_tokens=1)
    with pytest.raises(BadRequestError, match="too large"):
        await client.completions.create(model="sim-model", prompt="x", max_tokens=500)
    with pytest.raises(BadRequestError, match="Priority scheduling is not enabled"):
        await client.completions.create(
            model="sim-model", prompt="x", max_tokens=1, extra_body={"priority": 3}
        )
    with pytest.raises(BadRequestError, match="min_tokens"):
        await client.completions.create(
            model="sim-model", prompt="x", max_tokens=2, extra_body={"min_tokens": 5}
        )
    with pytest.raises(BadRequestError, match="cache_salt"):
        await client.completions.create(
            model="sim-model", prompt="x", max_tokens=1, extra_body={"cache_salt": ""}
        )
    await client.close()
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{fleet.engines[0].url}/v1/completions", data=b"{")
        assert resp.status == 400
        assert "not valid JSON" in (await resp.json())["error"]["message"]
        resp = await session.get(f"{fleet.engines[0].url}/v1/nothing")
        assert resp.status == 404 and (await resp.json())["error"]["type"] == "not_found_error"


async def test_stop_strings_min_tokens_and_ignore_eos(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(default_max_tokens=4)
    url = f"{fleet.engines[0].url}/v1/completions"

    async def complete(**fields: object) -> dict:
        resp = await session.post(url, json={"prompt": "hi", **fields})
        assert resp.status == 200, await resp.text()
        return await resp.json()

    out = await complete(max_tokens=20, stop=["brown"])
    choice = out["choices"][0]
    assert choice["text"] == " The quick " and choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == "brown"
    out = await complete(max_tokens=20, stop="brown", include_stop_str_in_output=True)
    assert out["choices"][0]["text"] == " The quick brown"
    # No max_tokens: the simulated model ends its answer (EOS) after default_max_tokens.
    out = await complete()
    assert out["choices"][0]["finish_reason"] == "stop" and out["usage"]["completion_tokens"] == 4
    out = await complete(min_tokens=9)
    assert out["usage"]["completion_tokens"] == 10  # EOS is held back until min_tokens
    out = await complete(ignore_eos=True, max_tokens=12)
    assert (
        out["choices"][0]["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 12
    )


async def test_tokenize_prompt_and_messages(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    url = fleet.engines[0].url
    plain = await (await session.post(f"{url}/tokenize", json={"prompt": "hello world"})).json()
    assert plain["count"] == len(plain["tokens"]) == 4 and plain["max_model_len"] == 32768
    messages = [{"role": "user", "content": "hello world"}]
    chat = await (await session.post(f"{url}/tokenize", json={"messages": messages})).json()
    usage = (
        await (
            await session.post(
                f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 1}
            )
        ).json()
    )["usage"]
    assert chat["count"] == usage["prompt_tokens"]
    bad = await session.post(f"{url}/tokenize", json={"prompt": 3})
    assert bad.status == 400 and (await bad.json())["error"]["param"] == "prompt"


async def test_metrics_report_what_happened(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    url = fleet.engines[0].url
    usages = []
    for _ in range(3):
        resp = await session.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        usages.append((await resp.json())["usage"])
    values = await _metrics(session, url)
    assert values["vllm:prefix_cache_queries_total"] == sum(u["prompt_tokens"] for u in usages)
    assert values["vllm:prefix_cache_hits_total"] == sum(
        u["prompt_tokens_details"]["cached_tokens"] for u in usages
    )
    assert values["vllm:generation_tokens_total"] == 6
    assert values["vllm:time_to_first_token_seconds_count"] == 3
    assert values["vllm:e2e_request_latency_seconds_count"] == 3
    assert values["vllm:num_requests_running"] == 0 and values["vllm:num_requests_waiting"] == 0
    state = await (await session.get(f"{url}/sim/state")).json()
    assert values["vllm:kv_cache_usage_perc"] == state["kv_cache_usage"] == 0.0


async def test_client_disconnect_aborts_and_frees_blocks(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(time_scale=5.0)  # slow steps, so the request is still running
    engine = fleet.engines[0]
    body = {"prompt": PROMPT, "max_tokens": 1000, "stream": True}
    resp = await session.post(f"{engine.url}/v1/completions", json=body)
    await resp.content.readline()  # first chunk arrived: the request holds blocks
    assert engine.scheduler.running and engine.pool.usage() > 0
    resp.close()
    for _ in range(100):
        if not engine.scheduler.running:
            break
        await asyncio.sleep(0.02)
    assert not engine.scheduler.running and engine.pool.usage() == 0.0
    values = await _metrics(session, engine.url)
    assert values["vllm:request_success_total"] == 1  # the abort, under finished_reason="abort"


async def test_priority_and_cache_salt_over_http(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(scheduling_policy="priority")
    url = f"{fleet.engines[0].url}/v1/completions"
    for salt, expect_hit in (("a", False), ("a", True), ("b", False)):
        body = {"prompt": PROMPT, "max_tokens": 1, "cache_salt": salt, "priority": -1}
        usage = (await (await session.post(url, json=body)).json())["usage"]
        assert (usage["prompt_tokens_details"]["cached_tokens"] > 0) is expect_hit


async def test_coalesced_stream_writes_keep_every_chunk(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    engine = fleet.engines[0]
    url = f"{engine.url}/v1/completions"
    plain = await (await session.post(url, json={"prompt": "hi", "max_tokens": 20})).json()
    engine.stream_interval = 0.05  # as when the engine falls behind: several tokens per write
    resp = await session.post(url, json={"prompt": "hi", "max_tokens": 20, "stream": True})
    events = [ln[6:] for ln in (await resp.text()).split("\n\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 20
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]


async def test_python_api_submit_and_read_outputs(sim_fleet: FleetFactory) -> None:
    from hiveroute.sim.engine import SamplingParams

    fleet = await sim_fleet()
    engine = fleet.engines[0]
    handle = engine.submit(list(range(100, 140)), SamplingParams(max_tokens=5))
    outputs = []
    while True:
        out = await asyncio.wait_for(handle.queue.get(), 5)
        outputs.append(out)
        if out.finish_reason:
            break
    await handle.done
    assert [len(o.token_ids) for o in outputs] == [1] * 5 and outputs[-1].finish_reason == "length"
    assert handle.completion_tokens == 5 and handle.prompt_tokens == 40


async def test_preemption_under_memory_pressure_is_counted_and_recovers(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(num_blocks=9, block_size=16)  # 8 usable blocks
    engine = fleet.engines[0]
    url = f"{engine.url}/v1/completions"
    bodies = [
        {"prompt": list(range(base, base + 40)), "max_tokens": 60, "ignore_eos": True}
        for base in (100, 300)
    ]
    # Each needs 7 blocks at its end; together they outgrow the pool, so one is preempted and
    # recomputed later: both still finish with every token.
    results = await asyncio.gather(*(session.post(url, json=b) for b in bodies))
    usages = [(await r.json())["usage"] for r in results]
    assert [u["completion_tokens"] for u in usages] == [60, 60]
    values = await _metrics(session, engine.url)
    assert values["vllm:num_preemptions_total"] == engine.state()["preemptions"] >= 1


async def test_chunked_prefill_over_http(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(max_num_batched_tokens=16)
    engine = fleet.engines[0]
    prompt = list(range(100, 200))  # 100 tokens: 7 steps of at most 16 tokens before the first
    out = await (
        await session.post(f"{engine.url}/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    ).json()
    assert out["usage"]["prompt_tokens"] == 100
    assert engine.steps == 7
    values = await _metrics(session, engine.url)
    assert values["vllm:prompt_tokens_total"] == 100


async def test_without_prefix_caching_nothing_is_reused_or_published(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(enable_prefix_caching=False)
    engine = fleet.engines[0]
    url = f"{engine.url}/v1/completions"
    for _ in range(2):
        out = await (await session.post(url, json={"prompt": PROMPT, "max_tokens": 1})).json()
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    values = await _metrics(session, engine.url)
    assert values["vllm:prefix_cache_queries_total"] == 0
    assert engine.publisher is not None and engine.publisher.batches_sent == 0


async def test_tokens_leave_at_the_modelled_step_end_and_first_tokens_are_never_held(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(time_scale=20.0)  # steps of ~0.1 s: early writes would show
    engine = fleet.engines[0]
    engine.stream_interval = 60.0  # hold every middle token until the stream ends
    body = {"prompt": PROMPT, "max_tokens": 6, "stream": True}
    prompt_tokens = len(engine.tokenizer.encode(PROMPT))
    prefill = 20.0 * engine.cost.step_time(prompt_tokens, prompt_tokens**2 // 2, 0, 0)
    started = asyncio.get_running_loop().time()
    resp = await session.post(f"{engine.url}/v1/completions", json=body)
    first = await resp.content.readline()
    elapsed = asyncio.get_running_loop().time() - started
    assert first.startswith(b"data: ")
    # The first token is written when its (prefill) step is due, not while it is computed,
    # and it is not held with the middle tokens: the request is still running.
    assert elapsed >= 0.95 * prefill
    assert engine.scheduler.running
    rest = (await resp.text()).split("\n\n")
    rest_events = [e.strip()[6:] for e in rest if e.strip().startswith("data: ")]
    events = [first.decode().strip()[6:], *rest_events]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 6 and chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_a_finished_stream_frees_its_request_without_the_cyclic_collector(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    """A request left in a reference cycle waits for a pass of the garbage collector, and
    hundreds of them make those passes long enough to stall every engine's steps."""
    fleet = await sim_fleet()
    engine = fleet.engines[0]
    handles: list[weakref.ref[RequestHandle]] = []
    submit = engine.submit

    def tracked_submit(*args: Any, **kwargs: Any) -> RequestHandle:
        handle = submit(*args, **kwargs)
        handles.append(weakref.ref(handle))
        return handle

    engine.submit = tracked_submit  # type: ignore[method-assign]
    gc.collect()
    gc.disable()
    try:
        for stream in (True, False):
            body = {"prompt": PROMPT, "max_tokens": 4, "stream": stream}
            resp = await session.post(f"{engine.url}/v1/completions", json=body)
            assert resp.status == 200
            await resp.read()
        for _ in range(50):  # the handlers finish just after the last byte is sent
            if all(ref() is None for ref in handles):
                break
            await asyncio.sleep(0.01)
        assert len(handles) == 2
        assert [ref() is None for ref in handles] == [True, True]
    finally:
        gc.enable()


async def test_requests_are_taken_in_in_arrival_order_without_a_long_wait(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    """vLLM's scheduler sees requests in the order they arrive, and taking one in costs it
    only its parsing: the intake may wait for a gap between other engines' step ends
    (deadlines.py), but only briefly, and never lets a later request overtake."""
    fleet = await sim_fleet()
    engine = fleet.engines[0]
    submitted: list[int] = []
    submit = engine.submit

    def recording_submit(tokens: Any, params: Any) -> RequestHandle:
        submitted.append(params.max_tokens)
        return submit(tokens, params)

    waits: list[float] = []
    gap = engine.board.gap

    async def recording_gap(need: float, **kwargs: Any) -> None:
        if "owner" not in kwargs:  # the intake's (an engine's own work names its engine)
            latest = kwargs.get("latest")
            waits.append(float("inf") if latest is None else latest - time.monotonic())
        await gap(need, **kwargs)

    engine.submit = recording_submit  # type: ignore[method-assign]
    engine.board.gap = recording_gap  # type: ignore[method-assign]
    engine.board.sleeping_until(99, time.monotonic() - 1.0)  # a stuck engine, never served

    async def post(prompt: str, max_tokens: int) -> int:
        body = {"prompt": prompt, "max_tokens": max_tokens}
        resp = await session.post(f"{engine.url}/v1/completions", json=body)
        await resp.read()
        return resp.status

    await engine.intake_lock.acquire()  # hold the intake while all three arrive
    sizes = [PROMPT * 40, PROMPT, PROMPT * 10]  # the longest first: it must not be passed
    tasks = []
    for max_tokens, prompt in enumerate(sizes, start=1):
        tasks.append(asyncio.create_task(post(prompt, max_tokens)))
        await asyncio.sleep(0.05)
    engine.intake_lock.release()
    assert await asyncio.gather(*tasks) == [200, 200, 200]
    assert submitted == [1, 2, 3]
    assert len(waits) == 3 and max(waits) <= INTAKE_MAX_WAIT


async def test_metrics_report_the_cache_size_as_vllm_does(sim_fleet: FleetFactory) -> None:
    """vLLM's CacheConfig is the labels of `vllm:cache_config_info`; the router reads
    `num_gpu_blocks` there to know how much an engine's cache holds."""
    fleet = await sim_fleet()
    engine = fleet.engines[0]
    async with aiohttp.ClientSession() as session:
        text = await (await session.get(f"{engine.url}/metrics")).text()
    labels = info_labels(text, "vllm:cache_config_info")
    assert labels is not None
    assert int(labels["num_gpu_blocks"]) == engine.pool.num_blocks
    assert int(labels["block_size"]) == engine.block_size


def test_info_labels_read_quoted_values_with_commas() -> None:
    text = 'x 1\nvllm:cache_config_info{block_size="16",note="a,b",num_gpu_blocks="4000"} 1.0\n'
    assert info_labels(text, "vllm:cache_config_info") == {
        "block_size": "16",
        "note": "a,b",
        "num_gpu_blocks": "4000",
    }
    assert info_labels(text, "vllm:other_info") is None
