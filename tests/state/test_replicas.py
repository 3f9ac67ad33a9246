"""Router replicas sharing one real Redis: they agree on every workflow's engines, a restarted
replica rebuilds its state from Redis, and a Redis outage costs no request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from hiveroute.bench.redis_server import RedisServer
from hiveroute.server import RunningRouter
from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.services

PROMPT = "You are one agent of a team. Shared context: " + "facts " * 300


@pytest.fixture
async def engines() -> AsyncIterator[list[FakeEngine]]:
    started = [FakeEngine(f"e{i}") for i in range(3)]
    for engine in started:
        await engine.start()
    yield started
    for engine in started:
        await engine.stop()


def names(router: RunningRouter) -> list[str]:
    return sorted(e.name for e in router.router.pool.engines)


async def ask(http: aiohttp.ClientSession, router: RunningRouter, workflow: str, agent: str) -> str:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"Workflow {workflow}. {PROMPT}{agent}"}],
        "max_tokens": 2,
        "hiveroute": {"workflow_id": workflow, "agent_id": agent},
    }
    async with http.post(f"{router.url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        engine = resp.headers["X-Hiveroute-Engine"]
    service = router.router.workflows
    assert service is not None
    await service.flush()  # its bookkeeping is in the store before the next replica reads
    return engine


async def start_on(
    http: aiohttp.ClientSession, router: RunningRouter, workflow: str, held_out: list[str]
) -> str:
    """The workflow's first request through `router`, while `held_out` engines look down to it
    (so its home is not the engine every replica would pick for a new workflow)."""
    pool = router.router.pool
    for name in held_out:
        pool.get(name).mark_down("held out by the test")  # type: ignore[union-attr]
    try:
        return await ask(http, router, workflow, "planner")
    finally:
        for name in held_out:
            pool.get(name).mark_up()  # type: ignore[union-attr]


async def workflow(http: aiohttp.ClientSession, router: RunningRouter, wid: str) -> Any:
    async with http.get(f"{router.url}/v1/workflows/{wid}") as resp:
        return resp.status, await resp.json()


async def test_replicas_agree_and_a_restarted_replica_rebuilds_from_redis(
    redis_server: RedisServer,
    engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
) -> None:
    urls = [e.url for e in engines]
    options: dict[str, Any] = {
        "policy": "workflow",
        "state": redis_server.url + "?timeout_s=5",
        "health_interval_s": 60,  # the test decides which engines look down
    }
    a = await router_factory(urls, **options)
    b = await router_factory(urls, **options)
    low, mid, top = names(a)
    homes = {  # each started where the others look down, through either replica
        "w-low": await start_on(http, a, "w-low", held_out=[mid, top]),
        "w-mid": await start_on(http, b, "w-mid", held_out=[low, top]),
        "w-top": await start_on(http, a, "w-top", held_out=[low, mid]),
    }
    assert homes == {"w-low": low, "w-mid": mid, "w-top": top}
    for i in range(6):  # alternate replicas: each request of a workflow goes to its home
        for wid, home in homes.items():
            replica = (a, b)[(i + (wid == "w-mid")) % 2]
            assert await ask(http, replica, wid, f"executor-{i}") == home, (wid, i)
    for replica in (a, b):
        status, doc = await workflow(http, replica, "w-low")
        assert status == 200 and doc["home_engine"] == low
        assert doc["totals"]["requests"] == 7 and doc["engines"] == {low: 7}
        assert len(doc["agents"]) == 7

    await a.stop()  # a replica restarts: a new process with nothing local
    c = await router_factory(urls, **options)
    status, doc = await workflow(http, c, "w-low")
    assert status == 200 and doc["home_engine"] == low and doc["totals"]["requests"] == 7
    assert await ask(http, c, "w-low", "validator") == low
    assert await ask(http, c, "w-mid", "validator") == mid
    async with http.get(f"{c.url}/v1/workflows") as resp:
        listed = {w["id"]: w["home_engine"] for w in (await resp.json())["data"]}
    assert listed == homes


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exposed")


async def scrape(http: aiohttp.ClientSession, router: RunningRouter) -> str:
    async with http.get(f"{router.url}/metrics") as resp:
        return await resp.text()


async def test_redis_outage_keeps_requests_succeeding_and_reconciles(
    redis_server: RedisServer,
    engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hiveroute.state")
    urls = [e.url for e in engines]
    options: dict[str, Any] = {
        "policy": "workflow",
        "state": redis_server.url + "?timeout_s=2&probe_s=0.1",
        "health_interval_s": 60,
    }
    a = await router_factory(urls, **options)
    b = await router_factory(urls, **options)
    low, mid, top = names(a)
    assert await start_on(http, a, "w-old", held_out=[mid, top]) == low
    assert await ask(http, b, "w-old", "critic") == low  # both replicas have seen it
    assert metric(await scrape(http, a), "hiveroute_state_backend_up") == 1

    redis_server.stop()
    for i in range(4):  # both replicas keep serving, and keep the home they know
        assert await ask(http, (a, b)[i % 2], "w-old", f"executor-{i}") == low
    assert await start_on(http, b, "w-new", held_out=[low, top]) == mid  # born in the outage
    assert await ask(http, b, "w-new", "executor") == mid
    for replica in (a, b):
        text = await scrape(http, replica)
        assert metric(text, "hiveroute_state_backend_up") == 0
        assert metric(text, "hiveroute_state_errors_total") >= 1
        assert metric(text, "hiveroute_state_local_operations_total") > 0
    down = [r for r in caplog.records if "is unreachable" in r.getMessage()]
    assert len(down) == 2 and all(r.levelno == logging.WARNING for r in down)  # one per replica

    redis_server.start()  # empty: it was not persisting
    for _ in range(200):
        texts = [await scrape(http, r) for r in (a, b)]
        if all(metric(t, "hiveroute_state_backend_up") == 1 for t in texts):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the replicas did not switch back to Redis")
    back = [r for r in caplog.records if "is back after" in r.getMessage()]
    assert len(back) == 2
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        assert await client.get("hiveroute:wf:home:w-old") == low
        assert await client.get("hiveroute:wf:home:w-new") == mid
    finally:
        await client.aclose()
    c = await router_factory(urls, **options)  # a new replica sees what both wrote
    status, doc = await workflow(http, c, "w-new")
    assert status == 200 and doc["home_engine"] == mid and doc["totals"]["requests"] == 2
    status, doc = await workflow(http, c, "w-old")
    assert status == 200 and doc["home_engine"] == low
    # 6 requests; a counter comes back from copies as fresh as each replica's last read of it,
    # so the other replica's pre-outage request may be missing from one of them
    assert 5 <= doc["totals"]["requests"] <= 6
    assert await ask(http, c, "w-old", "validator") == low


async def test_a_partitioned_replica_adopts_the_home_chosen_elsewhere(
    redis_server: RedisServer,
    engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
) -> None:
    proxy = TcpProxy("127.0.0.1", redis_server.port)
    await proxy.start()
    urls = [e.url for e in engines]
    options: dict[str, Any] = {"policy": "workflow", "health_interval_s": 60}
    a = await router_factory(urls, state=redis_server.url + "?timeout_s=5", **options)
    b = await router_factory(urls, state=proxy.url + "?timeout_s=1&probe_s=0.1", **options)
    low, mid, top = names(a)
    try:
        proxy.set_mode("hang")  # b loses Redis; a still has it
        assert await start_on(http, a, "w", held_out=[mid, top]) == low
        # b alone makes its own choice (where the others look down to it), and serves it
        assert await start_on(http, b, "w", held_out=[low, mid]) == top
        proxy.set_mode("open")
        store = b.router.state_store
        for _ in range(200):
            if store.up:
                break
            await asyncio.sleep(0.05)
        assert store.up, "b did not reconnect"
        seen = []
        for i in range(40):  # within a view refresh (1 s), b follows the winner in Redis
            seen.append(await ask(http, b, "w", f"late-{i}"))
            if seen[-1] == low:
                break
            await asyncio.sleep(0.05)
        assert seen[-1] == low, seen
        assert await ask(http, a, "w", "validator") == low
        status, doc = await workflow(http, a, "w")
        assert status == 200 and doc["home_engine"] == low
        for _ in range(100):  # b's are counted (a request's end is written after its response)
            if doc["engines"][top] == 1 + seen.count(top):
                break
            await asyncio.sleep(0.05)
            status, doc = await workflow(http, a, "w")
        assert doc["engines"][top] == 1 + seen.count(top)
    finally:
        await proxy.stop()
