"""The gateway against real HTTP servers on loopback: relaying, streaming, failover, errors."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine
from tests.support.relay import relay_to_transport


async def post(
    http: aiohttp.ClientSession, url: str, body: object, **kw: object
) -> aiohttp.ClientResponse:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return await http.post(
        url, data=data, headers=kw.pop("headers", {"Content-Type": "application/json"}), **kw
    )  # type: ignore[arg-type]


async def test_non_streamed_relay_strips_router_fields_and_passes_the_rest(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    router = await router_factory([e.url for e in fake_engines], policy="round_robin")
    body = {
        "model": "m",
        "prompt": "hi",
        "hiveroute": {"workflow_id": "w"},
        "vendor_knob": [1, {"a": 2}],
    }
    resp = await post(
        http, f"{router.url}/v1/completions", body, headers={"X-Request-Id": "mine-1"}
    )
    assert resp.status == 200
    payload = await resp.json()
    assert payload["usage"]["prompt_tokens_details"]["cached_tokens"] == 4
    assert resp.headers["X-Request-Id"] == "mine-1"
    assert resp.headers["X-Hiveroute-Policy"] == "round_robin"
    served = [e for e in fake_engines if e.received]
    assert len(served) == 1 and resp.headers["X-Hiveroute-Engine"] == f"127.0.0.1:{served[0].port}"
    seen = served[0].received[0]
    assert "hiveroute" not in seen and seen["vendor_knob"] == [1, {"a": 2}]
    assert served[0].received_headers[0]["X-Request-Id"] == "mine-1"


async def test_a_cookie_an_engine_sets_reaches_its_client_and_no_other_request(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    """The router's one connection pool serves every client: a cookie set on one answer is the
    client's, never sent to the engine again with someone else's request."""
    engine = fake_engines[0]
    engine.behaviour.set_cookie = "route=engine-0; Path=/"
    # by name, not by address: aiohttp's cookie jar keeps no cookie an IP address sets
    router = await router_factory([f"http://localhost:{engine.port}"], policy="round_robin")
    body = {"model": "m", "prompt": "hi", "max_tokens": 2}
    for _ in range(2):
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as client:
            resp = await post(client, f"{router.url}/v1/completions", body)
            assert resp.status == 200, await resp.text()
            assert resp.headers.get("Set-Cookie") == "route=engine-0; Path=/"
            await resp.read()
    assert [h.get("Cookie") for h in engine.received_headers] == [None, None]


async def test_body_without_router_fields_is_forwarded_byte_for_byte(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    router = await router_factory([fake_engines[0].url])
    raw = b'{"model":"m",   "prompt":"exact bytes", "n": 1}'
    resp = await post(http, f"{router.url}/v1/completions", raw)
    assert resp.status == 200
    assert fake_engines[0].received_raw == [raw]
    assert resp.headers["X-Request-Id"].startswith("hr-")


async def test_stream_is_relayed_chunk_by_chunk(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    engine.behaviour.hold_after_chunk = 0
    router = await router_factory([engine.url])
    resp = await post(
        http, f"{router.url}/v1/completions", {"model": "m", "prompt": "p", "stream": True}
    )
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=10)
    # The engine is holding the rest: the router relayed chunk 0 without waiting for more.
    assert b"t0" in first and engine.chunks_sent == 1
    engine.release.set()
    rest = await resp.read()
    assert b"t1" in rest and b"t2" in rest and rest.rstrip().endswith(b"data: [DONE]")


async def test_client_disconnect_cancels_the_upstream_request(
    fake_engines: list[FakeEngine], router_factory: RouterFactory
) -> None:
    engine = fake_engines[0]
    engine.behaviour.hold_after_chunk = 0
    router = await router_factory([engine.url])
    session = aiohttp.ClientSession()
    resp = await post(
        session, f"{router.url}/v1/completions", {"model": "m", "prompt": "p", "stream": True}
    )
    await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=10)
    resp.close()
    await session.close()
    await asyncio.wait_for(engine.stream_closed_by_client.wait(), timeout=10)
    assert engine.chunks_sent == 1
    for _ in range(100):  # the router's in-flight count returns to zero
        if router.router.pool.engines[0].load.in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert router.router.pool.engines[0].load.in_flight == 0


async def test_failover_when_an_engine_cannot_be_reached(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    dead, alive = fake_engines
    router = await router_factory([dead.url, alive.url], policy="round_robin", health_interval_s=60)
    dead_port = dead.port
    await dead.stop()
    for _ in range(4):
        resp = await post(http, f"{router.url}/v1/completions", {"model": "m", "prompt": "p"})
        assert resp.status == 200
        assert resp.headers["X-Hiveroute-Engine"] == f"127.0.0.1:{alive.port}"
    pool = router.router.pool
    assert not pool.get(f"127.0.0.1:{dead_port}").healthy  # type: ignore[union-attr]
    # It comes back: the health checker puts it back in rotation.
    await dead.start(port=dead_port)
    await pool.check_all()
    assert pool.get(f"127.0.0.1:{dead_port}").healthy  # type: ignore[union-attr]


async def test_no_first_byte_is_retried_on_another_engine(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    stalled, good = fake_engines
    stalled.behaviour.stall_before_response_s = 30
    router = await router_factory(
        [stalled.url, good.url],
        policy="round_robin",
        first_byte_timeout_s=0.3,
        health_interval_s=60,
    )
    engines = set()
    for _ in range(2):
        resp = await post(
            http, f"{router.url}/v1/completions", {"model": "m", "prompt": "p", "stream": True}
        )
        assert resp.status == 200
        engines.add(resp.headers["X-Hiveroute-Engine"])
        assert (await resp.read()).rstrip().endswith(b"[DONE]")
    assert engines == {f"127.0.0.1:{good.port}"}
    assert len(stalled.received) == 1  # tried once, then taken out of rotation


async def test_all_engines_down_gives_503_json(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    router = await router_factory([e.url for e in fake_engines], health_interval_s=60)
    for engine in fake_engines:
        await engine.stop()
    resp = await post(
        http,
        f"{router.url}/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "x"}]},
    )
    assert resp.status == 503
    error = (await resp.json())["error"]
    assert error["code"] == "no_engine_available" and "try again" in error["message"]
    resp = await post(http, f"{router.url}/v1/completions", {"model": "m", "prompt": "x"})
    assert resp.status == 503


async def test_engine_dying_mid_stream_ends_with_an_sse_error_event(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    engine.behaviour.hold_after_chunk = 0
    engine.behaviour.die_after_chunk = 0
    router = await router_factory([engine.url], health_interval_s=60)
    resp = await post(
        http, f"{router.url}/v1/completions", {"model": "m", "prompt": "p", "stream": True}
    )
    first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=10)
    assert b"t0" in first
    engine.release.set()  # now the engine's connection is cut
    text = (await resp.read()).decode()
    events = [e for e in text.split("\n\n") if e.strip()]
    error = json.loads(events[-2].removeprefix("data: "))
    assert error["error"]["code"] == "upstream_disconnected"
    assert events[-1] == "data: [DONE]"
    assert not router.router.pool.engines[0].healthy


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b"", 400, "empty"),
        (b'{"prompt": "\xff\xfe"}', 400, "UTF-8"),
        (b"[" * 100000 + b"]" * 100000, 400, "nested too deeply"),
        (
            json.dumps({"model": "m", "prompt": "p", "hiveroute": {"priority": "urgent"}}).encode(),
            400,
            "priority",
        ),
        (
            json.dumps({"model": "m", "prompt": "p", "hiveroute": []}).encode(),
            400,
            "'hiveroute' must be",
        ),
        (json.dumps({"model": 3, "prompt": "p"}).encode(), 400, "'model' must be a string"),
        (json.dumps({"model": "m", "prompt": "p", "stream": "yes"}).encode(), 400, "'stream'"),
        (json.dumps({"model": "m"}).encode(), 400, "'prompt' is required"),
        (json.dumps({"model": "no-such-model", "prompt": "p"}).encode(), 404, "no-such-model"),
    ],
)
async def test_bad_input_gets_a_clear_4xx(
    fake_engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
    body: bytes,
    status: int,
    fragment: str,
) -> None:
    router = await router_factory([fake_engines[0].url])
    resp = await post(http, f"{router.url}/v1/completions", body)
    assert resp.status == status
    error = (await resp.json())["error"]
    assert fragment in error["message"]
    assert "Traceback" not in error["message"]
    assert fake_engines[0].received == []


async def test_body_over_the_limit_is_413(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    router = await router_factory([fake_engines[0].url], max_body_bytes=1000)
    resp = await post(http, f"{router.url}/v1/completions", {"model": "m", "prompt": "x" * 2000})
    assert resp.status == 413
    assert "1000" in (await resp.json())["error"]["message"]

    async def chunked() -> object:  # no Content-Length: the limit holds while reading
        for _ in range(10):
            yield b"x" * 500

    resp = await http.post(f"{router.url}/v1/completions", data=chunked())
    assert resp.status == 413


async def test_engine_4xx_goes_back_unchanged(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    engine.behaviour.status = 400
    engine.behaviour.error_body = {
        "object": "error",
        "message": "max_tokens too large",
        "code": 400,
    }
    router = await router_factory([engine.url])
    resp = await post(http, f"{router.url}/v1/completions", {"model": "m", "prompt": "p"})
    assert resp.status == 400
    assert await resp.json() == engine.behaviour.error_body
    assert router.router.pool.engines[0].healthy


async def test_models_health_metrics_and_unknown_routes(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    fake_engines[0].behaviour.models = ["a", "b"]
    fake_engines[1].behaviour.models = ["b", "c"]
    router = await router_factory([e.url for e in fake_engines])
    models = await (await http.get(f"{router.url}/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["a", "b", "c"]
    resp = await post(http, f"{router.url}/v1/completions", {"model": "c", "prompt": "p"})
    assert resp.headers["X-Hiveroute-Engine"] == f"127.0.0.1:{fake_engines[1].port}"
    health = await (await http.get(f"{router.url}/health")).json()
    assert health["status"] == "ok" and len(health["engines"]) == 2
    assert {e["kv_usage"] for e in health["engines"]} == {0.25}
    metrics = await (await http.get(f"{router.url}/metrics")).text()
    assert 'hiveroute_requests_total{endpoint="completions",engine="127.0.0.1:' in metrics
    assert "hiveroute_cached_tokens_total" in metrics
    assert all(line.startswith(("hiveroute_", "#")) for line in metrics.splitlines() if line)
    missing = await http.get(f"{router.url}/v2/nothing")
    assert missing.status == 404 and "no route" in (await missing.json())["error"]["message"]
    wrong = await http.get(f"{router.url}/v1/completions")
    assert wrong.status == 405 and "POST" in wrong.headers["Allow"]


async def test_least_load_uses_engine_metrics(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    busy, idle = fake_engines
    busy.behaviour.running, busy.behaviour.waiting = 30, 10
    router = await router_factory([busy.url, idle.url], policy="least_load")
    for _ in range(3):
        resp = await post(http, f"{router.url}/v1/completions", {"model": "m", "prompt": "p"})
        assert resp.headers["X-Hiveroute-Engine"] == f"127.0.0.1:{idle.port}"


async def test_official_openai_client_through_the_router(
    fake_engines: list[FakeEngine], router_factory: RouterFactory
) -> None:
    from openai import AsyncOpenAI

    router = await router_factory([fake_engines[0].url])
    client = AsyncOpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    done = await client.completions.create(
        model="m",
        prompt="hi",
        extra_body={"hiveroute": {"workflow_id": "w", "agent_role": "planner"}},
    )
    assert done.usage is not None and done.usage.prompt_tokens == 10
    stream = await client.completions.create(model="m", prompt="hi", stream=True)
    texts = [chunk.choices[0].text async for chunk in stream if chunk.choices]
    assert texts == ["t0 ", "t1 ", "t2 "]
    await client.close()


async def test_a_stream_s_headers_leave_with_its_first_chunk() -> None:
    """One send, not two, before the client has its first token."""
    first, second = b'data: {"t": 0}\n\n', b"data: [DONE]\n\n"
    writes = (await relay_to_transport(first, [second])).writes
    assert writes[0].startswith(b"HTTP/1.1 200") and first in writes[0]
    assert second not in writes[0] and b"".join(writes).endswith(b"0\r\n\r\n")
