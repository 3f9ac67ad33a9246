"""Keep-warm: re-touch idle prefixes on home engines, within a budget, until the workflow ends."""

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hiveroute.workflows.service import WorkflowService
from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine

SHARED = "The shared task and knowledge base. " * 20


class RetainingEngine(FakeEngine):
    """A fake engine that also takes the simulator's retention hint."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.retains: list[dict[str, Any]] = []

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/sim/retain", self._retain)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def _retain(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        self.retains.append(body)
        pinned = 128 if body["seconds"] > 0 else 0
        return web.json_response({"pinned_tokens": pinned, "pinned_blocks": pinned // 16})


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    e = FakeEngine("e")
    await e.start()
    yield e
    await e.stop()


def body(workflow: str, agent: str) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": SHARED + "You are " + agent},
            {"role": "user", "content": "go"},
        ],
        "hiveroute": {"workflow_id": workflow, "agent_id": agent},
    }


def warm_requests(engine: FakeEngine) -> list[dict[str, Any]]:
    return [b for b in engine.received if b.get("max_tokens") == 1]


async def test_idle_prefix_is_touched_within_budget_and_stops_when_ended(
    engine: FakeEngine, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory(
        [engine.url],
        policy="workflow",
        keep_warm_interval_s=3600,  # the loop never fires by itself: rounds are driven below
        keep_warm_idle_s=0,
        keep_warm_max_rps=0.001,  # a bucket of one request
    )
    service: WorkflowService = r.router.workflows
    for wf in ("w1", "w2"):
        for agent in ("planner", "executor"):
            async with http.post(f"{r.url}/v1/chat/completions", json=body(wf, agent)) as resp:
                assert resp.status == 200
    keep = service.keep_warm
    assert keep.round() == 1  # two idle workflows, a budget of one
    assert keep.round() == 0  # the bucket is empty
    await keep.drain()
    warm = warm_requests(engine)
    assert len(warm) == 1
    # the touch carries the text every agent's prompt starts with, and nothing else
    assert warm[0]["messages"] == [{"role": "system", "content": SHARED + "You are "}]
    assert warm[0]["model"] == "m" and warm[0]["stream"] is False

    keep.bucket.rate, keep.bucket.tokens = 1000.0, 10.0
    async with http.delete(f"{r.url}/v1/workflows/w1") as resp:
        assert resp.status == 200
    async with http.delete(f"{r.url}/v1/workflows/w2") as resp:
        assert resp.status == 200
    assert keep.round() == 0  # ended workflows are not kept warm


async def test_busy_or_recent_workflows_are_not_touched(
    engine: FakeEngine, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory(
        [engine.url], policy="workflow", keep_warm_interval_s=3600, keep_warm_idle_s=3600
    )
    service: WorkflowService = r.router.workflows
    async with http.post(f"{r.url}/v1/chat/completions", json=body("w", "a")) as resp:
        assert resp.status == 200
    assert service.keep_warm.round() == 0  # used just now
    view = service.registry.cached_view("w")
    assert view is not None
    service.keep_warm.idle_s = 0
    view.in_flight[1] = time.monotonic()  # an agent is mid-request: nothing to do
    assert service.keep_warm.round() == 0
    # a request that never finished (refused before routing) stops counting after a while
    stale = service.keep_warm.stale_after_s
    assert not view.busy(time.monotonic() + stale + 1, stale)
    assert not view.in_flight


async def test_other_policies_never_trigger_keep_warm(
    engine: FakeEngine, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory(
        [engine.url], policy="round_robin", keep_warm_interval_s=3600, keep_warm_idle_s=0
    )
    async with http.post(f"{r.url}/v1/chat/completions", json=body("w", "a")) as resp:
        assert resp.status == 200
    assert r.router.workflows.keep_warm.round() == 0


async def test_retention_hint_when_the_engine_takes_one_and_release_at_end(
    router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = RetainingEngine("sim")
    await engine.start()
    try:
        r = await router_factory(
            [engine.url], policy="workflow", keep_warm_interval_s=3600, keep_warm_idle_s=0
        )
        service: WorkflowService = r.router.workflows
        keep = service.keep_warm
        async with http.post(f"{r.url}/v1/chat/completions", json=body("w", "a")) as resp:
            assert resp.status == 200
        assert keep.round() == 1
        await keep.drain()
        assert engine.retains and engine.retains[0]["seconds"] == keep.retention_s
        assert keep.retain_supported == {r.router.pool.engines[0].name: True}
        # one agent so far: its whole system prompt is the prefix to keep
        assert engine.retains[0]["messages"] == [
            {"role": "system", "content": SHARED + "You are a"}
        ]
        assert not warm_requests(engine)  # a hint, not a one-token request
        async with http.delete(f"{r.url}/v1/workflows/w") as resp:
            assert resp.status == 200
        await keep.drain()
        assert engine.retains[-1]["seconds"] == 0  # pins released when the workflow ends
    finally:
        await engine.stop()


async def test_engine_without_hint_gets_a_one_token_request(
    engine: FakeEngine, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory(
        [engine.url], policy="workflow", keep_warm_interval_s=3600, keep_warm_idle_s=0
    )
    keep = r.router.workflows.keep_warm
    async with http.post(f"{r.url}/v1/chat/completions", json=body("w", "a")) as resp:
        assert resp.status == 200
    assert keep.round() == 1
    await keep.drain()
    assert keep.retain_supported == {r.router.pool.engines[0].name: False}
    assert len(warm_requests(engine)) == 1


async def test_no_keep_warm_after_long_idleness(
    engine: FakeEngine, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory(
        [engine.url], policy="workflow", keep_warm_interval_s=3600, keep_warm_idle_s=0
    )
    keep = r.router.workflows.keep_warm
    async with http.post(f"{r.url}/v1/chat/completions", json=body("w", "a")) as resp:
        assert resp.status == 200
    view = r.router.workflows.registry.cached_view("w")
    assert view is not None
    last = max(view.last_used.values())
    assert keep.round(now=last + keep.max_idle_s + 1) == 0  # idle for too long: let go
    assert keep.round(now=last + 1) == 1
    assert keep.under_pressure(r.router.pool.engines[0]) is False


async def test_under_pressure_a_touch_replaces_the_pin(
    router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = RetainingEngine("sim")
    await engine.start()
    try:
        r = await router_factory(
            [engine.url], policy="workflow", keep_warm_interval_s=3600, keep_warm_idle_s=0
        )
        keep = r.router.workflows.keep_warm
        async with http.post(f"{r.url}/v1/chat/completions", json=body("w", "a")) as resp:
            assert resp.status == 200
        load = r.router.pool.engines[0].load
        load.kv_usage = 0.95  # a nearly full cache needs its memory for requests
        assert keep.round() == 1
        await keep.drain()
        assert not engine.retains and len(warm_requests(engine)) == 1
        view = r.router.workflows.registry.cached_view("w")
        assert view is not None
        load.kv_usage = 0.2
        view.warmed_at.clear()
        assert keep.round() == 1
        await keep.drain()
        assert len(engine.retains) == 1  # room again: pinned
    finally:
        await engine.stop()


async def test_a_tenants_workflow_is_kept_warm_under_the_tenants_cache_salt(
    engine: FakeEngine, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    """A tenant's requests are salted, so its blocks are other blocks than the same text's
    unsalted ones: a keep-warm request without the salt warmed blocks no agent used."""
    r = await router_factory(
        [engine.url],
        policy="workflow",
        keep_warm_interval_s=3600,
        keep_warm_idle_s=0,
        api_keys={"key-tenant-a-000": "tenant-a"},
    )
    keep = r.router.workflows.keep_warm
    headers = {"Authorization": "Bearer key-tenant-a-000"}
    async with http.post(
        f"{r.url}/v1/chat/completions", json=body("w", "a"), headers=headers
    ) as resp:
        assert resp.status == 200
    assert keep.round() == 1
    await keep.drain()
    [agent] = [b for b in engine.received if b.get("max_tokens") == 2]
    [warm] = warm_requests(engine)
    assert agent["cache_salt"] and warm["cache_salt"] == agent["cache_salt"]


def test_a_tenants_cache_control_hint_keeps_its_salt() -> None:
    """The prefix a Messages request marked with cache_control is kept warm as the tenant's
    requests are salted: the hint's body carries the request's cache_salt."""
    from hiveroute.engines.engine import Engine, EngineSpec
    from hiveroute.metadata import RequestMetadata
    from hiveroute.routing.base import RequestOutcome, RoutingRequest
    from hiveroute.workflows.cache_hints import CacheControlHints

    class Hints:
        enabled = True
        bodies: list[dict[str, Any]] = []

        def hint(
            self, engine: str, path: str, body: dict[str, Any], ttl_s: float, key: str
        ) -> None:
            self.bodies.append(body)

    hints = Hints()
    request = RoutingRequest(
        "r",
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 4,
            "cache_salt": "tenant-a-salt",
            "system": [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "hi"}],
        },
        RequestMetadata(),
    )
    engine = Engine(EngineSpec("http://127.0.0.1:8100"))
    CacheControlHints(hints).after_complete(request, RequestOutcome(engine, 200))  # type: ignore[arg-type]
    [body] = hints.bodies
    assert body["cache_salt"] == "tenant-a-salt" and body["system"][0]["text"] == "rules"
