"""Every request the router makes to an engine carries the engine's key (--engine-api-key).

The engine here answers 401 to anything but /health without its key, as vLLM started with
--api-key does: the health round, the model list, the metrics scrape, proxied requests (streamed
and not), retention hints, keep-warm touches and pre-warm must all carry it.
"""

from __future__ import annotations

import aiohttp

from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine

SHARED = "The shared task and knowledge base. " * 20
KEY = "engine-secret-0"


def chat(workflow: str, agent: str, **extra: object) -> dict[str, object]:
    return {
        "model": "m",
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": SHARED + "You are " + agent},
            {"role": "user", "content": "go"},
        ],
        "hiveroute": {"workflow_id": workflow, "agent_id": agent},
        **extra,
    }


async def test_every_engine_call_carries_the_engine_key(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    engine.behaviour.api_key = KEY
    r = await router_factory(
        [engine.url],
        engine_api_key=KEY,
        policy="workflow",
        keep_warm_interval_s=3600,  # rounds are driven below
        keep_warm_idle_s=0,
        keep_warm_max_rps=1000,
    )
    async with http.get(f"{r.url}/v1/models") as resp:
        assert resp.status == 200
        assert [m["id"] for m in (await resp.json())["data"]] == ["m"]
    for extra in ({}, {"stream": True}):
        async with http.post(f"{r.url}/v1/chat/completions", json=chat("w", "a", **extra)) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()
    keep = r.router.workflows.keep_warm
    assert keep.round() == 1
    await keep.drain()
    view = r.router.workflows.registry.cached_view("w")
    assert view is not None
    assert await keep.prewarm(view, r.router.pool.engines[0], SHARED)

    paths = {(method, path) for method, path, _ in engine.calls}
    for call in (
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/sim/retain"),  # the fake engine has none (404): the touch follows
    ):
        assert call in paths
    touches = [b for b in engine.received if b.get("max_tokens") == 1]
    assert len(touches) == 2  # the keep-warm touch and the pre-warm
    refused = [(m, p) for m, p, auth in engine.calls if auth != f"Bearer {KEY}" and p != "/health"]
    assert refused == []
    text = await (await http.get(f"{r.url}/metrics")).text()
    warm_lines = [
        line for line in text.splitlines() if line.startswith("hiveroute_keep_warm_requests_total")
    ]
    assert any('kind="touch",result="ok"' in line for line in warm_lines)
    assert any('kind="prewarm",result="ok"' in line for line in warm_lines)
    assert not any('result="error"' in line for line in warm_lines)


async def test_without_the_key_the_engine_lists_no_model(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    """The failure the key prevents: the engine is up but answers 401 to the model list."""
    engine = fake_engines[0]
    engine.behaviour.api_key = KEY
    r = await router_factory([engine.url])
    async with http.get(f"{r.url}/v1/models") as resp:
        assert (await resp.json())["data"] == []
