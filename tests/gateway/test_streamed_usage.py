"""A streamed request is accounted for whether or not its client asked for usage.

The router asks the engine for the usage chunk (`stream_options.include_usage`) and, when the
client did not ask, reads it and drops it from the client's stream: the access log, the token
counters and the dashboard count every streamed request. Both relayed APIs are covered.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
import pytest

from tests.conftest import RouterFactory
from tests.support.access import access_lines, metric_sum
from tests.support.fake_engine import FakeEngine

BODIES = {
    "/v1/completions": {"model": "m", "prompt": "p", "max_tokens": 3},
    "/v1/chat/completions": {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
    },
}


def events(raw: bytes) -> list[Any]:
    found = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: ") and block != "data: [DONE]":
            found.append(json.loads(block[6:]))
    return found


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("client_asks", [False, True])
async def test_streamed_usage_is_counted_and_only_shown_when_asked(
    path: str,
    client_asks: bool,
    fake_engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hiveroute.access")
    engine = fake_engines[0]
    r = await router_factory([engine.url])
    body: dict[str, Any] = {**BODIES[path], "stream": True}
    if client_asks:
        body["stream_options"] = {"include_usage": True}
    async with http.post(f"{r.url}{path}", json=body, headers={"X-Request-Id": "s-1"}) as resp:
        assert resp.status == 200
        raw = await resp.read()
    assert raw.endswith(b"data: [DONE]\n\n")
    received = events(raw)
    usage_chunks = [e for e in received if e.get("usage")]
    assert len(usage_chunks) == (1 if client_asks else 0)
    assert len([e for e in received if e["choices"]]) == 3  # every content chunk got through
    assert engine.received[-1]["stream_options"]["include_usage"] is True

    [line] = access_lines(caplog, "s-1")
    assert (line["prompt_tokens"], line["cached_tokens"]) == (10, 4)
    text = await (await http.get(f"{r.url}/metrics")).text()
    assert metric_sum(text, "hiveroute_prompt_tokens_total") == 10
    assert metric_sum(text, "hiveroute_cached_tokens_total") == 4
    async with http.get(f"{r.url}/dashboard/api/overview") as resp:
        totals = (await resp.json())["totals"]
    assert (totals["prompt_tokens"], totals["cached_tokens"]) == (10, 4)


async def test_other_stream_options_are_kept(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    r = await router_factory([engine.url])
    body = {"model": "m", "prompt": "p", "stream": True, "stream_options": {"x_flag": 1}}
    async with http.post(f"{r.url}/v1/completions", json=body) as resp:
        await resp.read()
    assert engine.received[-1]["stream_options"] == {"x_flag": 1, "include_usage": True}


def test_the_usage_option_is_spliced_into_the_raw_body() -> None:
    from hiveroute.gateway.pipeline import upstream_payload

    raw = b'{"model": "m", "prompt": "p", "stream": true}\n  '
    body = json.loads(raw)
    sent = json.loads(upstream_payload(body, raw, add_usage=True))
    assert sent == {**body, "stream_options": {"include_usage": True}}
    assert upstream_payload(body, raw, add_usage=False) is raw  # byte for byte
    options = {**body, "stream_options": {"x": 1}}
    assert json.loads(upstream_payload(options, None, add_usage=True))["stream_options"] == {
        "x": 1,
        "include_usage": True,
    }


def test_a_usage_event_split_across_chunks_is_still_dropped() -> None:
    from hiveroute.gateway.proxy import UsageChunkFilter

    content = b'data: {"choices": [{"text": "a"}]}\n\n'
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 3}}\n\n'
    stream = content + usage + b"data: [DONE]\n\n"
    for cut in range(1, len(stream)):
        f = UsageChunkFilter()
        out = f.feed(stream[:cut]) + f.feed(stream[cut:]) + f.rest()
        assert out == content + b"data: [DONE]\n\n", cut


async def test_the_relay_drops_a_usage_event_wherever_the_engine_splits_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The relay passes whole events through without the filter; a chunk that ends between an
    event's two newlines must not, or the usage event after it takes the closing newline with
    it and the client sees the last content event run into `[DONE]`."""
    from tests.support.relay import relay

    content = b'data: {"choices": [{"text": "a"}]}\n\n'
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 3}}\n\n'
    stream = content + usage + b"data: [DONE]\n\n"
    for cut in range(1, len(stream)):
        written, result = await relay(monkeypatch, stream[:cut], [stream[cut:]], drop_usage=True)
        assert written.data == content + b"data: [DONE]\n\n", cut
        assert result.usage is not None and result.usage.prompt_tokens == 3


@pytest.mark.parametrize(
    "delta",
    [
        b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta"}\n\n',
        b'event: response.function_call_arguments.delta\ndata: {"delta": "{\\"a"}\n\n',
        b'event: response.reasoning_text.delta\ndata: {"delta": "hm"}\n\n',
    ],
)
async def test_a_responses_stream_has_its_first_token_at_its_first_delta_of_any_kind(
    delta: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn that only calls a tool streams function_call_arguments deltas, never an
    output_text delta: its first token was never seen (no TTFT, its prefill counted on its
    engine until the end). An event's data that merely mentions a delta is not one."""
    from hiveroute.gateway import proxy
    from hiveroute.gateway.apis import RESPONSES
    from tests.support.relay import relay

    opening = b'event: response.created\ndata: {"instructions": "say .delta\\ndata: twice"}\n\n'
    times = iter([2.0, 3.0, 4.0])
    heard: list[bool] = []
    monkeypatch.setattr(proxy.time, "perf_counter", lambda: next(times))
    _, result = await relay(
        monkeypatch,
        opening,
        [delta, b"event: response.completed\ndata: {}\n\n"],
        api=RESPONSES,
        first_token=lambda: heard.append(True),
    )
    assert heard == [True] and result.ttft_s == 2.0 - 0.5
