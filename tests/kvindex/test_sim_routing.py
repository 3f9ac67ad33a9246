"""Routed traffic on simulated engines: the index holds exactly the engines' blocks."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from hiveroute.config import RouterConfig
from hiveroute.kvindex.index import KvIndex
from hiveroute.server import RunningRouter, start_router
from hiveroute.sim.config import SimConfig
from hiveroute.sim.fleet import SimFleet

CONTEXT = " ".join(f"fact{i} about the shared plan" for i in range(120))


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    config = SimConfig(
        engines=2, base_port=0, events_base_port=0, block_size=16, preset="fast", num_blocks=160
    )
    sims = SimFleet(config)
    await sims.start()
    try:
        yield sims
    finally:
        await sims.stop()


@pytest.fixture
async def router(fleet: SimFleet) -> AsyncIterator[RunningRouter]:
    config = RouterConfig(host="127.0.0.1", port=0, engine=fleet.engine_spec_texts(), policy="kv")
    running = await start_router(config.validate())
    events = running.router.kv_events
    for sub in events.subscribers.values():
        await asyncio.wait_for(sub.connected.wait(), 5)
    try:
        yield running
    finally:
        await running.stop()


def engine_truth(fleet: SimFleet) -> dict[str, set[int]]:
    """Each engine's cached block hashes, read from the engine itself."""
    out = {}
    for engine in fleet.engines:
        name = engine.url.removeprefix("http://")
        out[name] = set(engine.pool.cached)
    return out


async def settled(index: KvIndex, fleet: SimFleet, timeout_s: float = 5.0) -> dict[str, set[Any]]:
    """Wait until the index agrees with the engines (events are asynchronous), bounded."""
    truth = engine_truth(fleet)
    for _ in range(int(timeout_s / 0.05)):
        truth = engine_truth(fleet)
        if all(index.engine_hashes(name) == hashes for name, hashes in truth.items()):
            break
        await asyncio.sleep(0.05)
    return truth


async def complete(session: aiohttp.ClientSession, url: str, prompt: str, **meta: str) -> Any:
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 4, "hiveroute": meta}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["X-Hiveroute-Engine"], await resp.json()


async def test_index_matches_engines_after_routed_traffic(
    fleet: SimFleet, router: RunningRouter
) -> None:
    index: KvIndex = router.router.kv_index
    async with aiohttp.ClientSession() as session:
        first, _ = await complete(
            session, router.url, CONTEXT + " plan it", workflow_id="w1", agent_id="planner"
        )
        await settled(index, fleet)
        for i in range(4):  # siblings share the planner's context: same engine, cache hits
            engine, answer = await complete(
                session,
                router.url,
                CONTEXT + f" execute step {i}",
                workflow_id="w1",
                agent_id=f"executor{i}",
            )
            assert engine == first
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        for i in range(12):  # unrelated traffic: the small caches evict (BlockRemoved)
            await complete(session, router.url, f"other topic {i} " * 60)
        truth = await settled(index, fleet)
        assert all(index.engine_hashes(name) == hashes for name, hashes in truth.items())
        assert sum(e.pool.evictions for e in fleet.engines) > 0
        async with session.get(f"{router.url}/metrics") as resp:
            metrics = await resp.text()
    assert 'hiveroute_routing_decisions_total{policy="kv",reason="kv_hit"}' in metrics
    assert "hiveroute_kv_index_blocks " in metrics


async def test_cross_agent_tokens_count_what_the_planner_stored(
    fleet: SimFleet, router: RunningRouter
) -> None:
    """The executor's cache hit on the planner's blocks is cross-agent (the accountant keys
    blocks as the index does)."""
    index: KvIndex = router.router.kv_index
    async with aiohttp.ClientSession() as session:
        await complete(session, router.url, CONTEXT, workflow_id="w", agent_id="plan")
        await settled(index, fleet)
        _, answer = await complete(
            session, router.url, CONTEXT + " my own question", workflow_id="w", agent_id="exec"
        )
        cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        await router.router.workflows.flush()
        async with session.get(f"{router.url}/v1/workflows/w") as resp:
            workflow = await resp.json()
    executor = workflow["requests"][1]
    assert cached >= 16 * 10
    assert executor["cross_agent_cached_tokens"] == cached


async def test_engine_restart_is_reflected(fleet: SimFleet, router: RunningRouter) -> None:
    index: KvIndex = router.router.kv_index
    async with aiohttp.ClientSession() as session:
        for i in range(4):
            name, _ = await complete(session, router.url, CONTEXT + f" q{i}")
        await settled(index, fleet)
        engine = next(e for e in fleet.engines if e.url.endswith(name))
        assert index.engine_hashes(name)
        assert engine.reset_prefix_cache()  # as a restarted engine: empty cache ...
        await engine.restart_events()  # ... and a publisher counting from 0 again
        for i in range(4):
            await complete(session, router.url, f"after restart {i} " * 30)
        truth = await settled(index, fleet)
        assert all(index.engine_hashes(n) == hashes for n, hashes in truth.items())
    stats = router.router.kv_events.subscribers[name].stats
    assert stats.events > 0


async def test_salted_requests_are_indexed_under_their_salt(
    fleet: SimFleet, router: RunningRouter
) -> None:
    index: KvIndex = router.router.kv_index
    tokenizer = router.router.tokenizer
    body = {"model": "sim-model", "prompt": CONTEXT, "max_tokens": 2, "cache_salt": "tenant-a"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{router.url}/v1/completions", json=body) as resp,
    ):
        assert resp.status == 200
        engine = resp.headers["X-Hiveroute-Engine"]
    await settled(index, fleet)
    ids = tokenizer.encode(CONTEXT)
    assert index.match_tokens(engine, ids, salt="tenant-a").tokens == len(ids) // 16 * 16
    assert index.match_tokens(engine, ids).tokens == 0
    assert index.match_tokens(engine, ids, salt="tenant-b").tokens == 0


async def test_token_ids_the_router_cannot_key_are_left_to_the_engine(
    fleet: SimFleet, router: RunningRouter
) -> None:
    """A prompt of token ids below 0 or past 64 bits cannot be keyed: the request is routed on
    load alone and the engine answers it as it would answer it directly (no router error)."""
    direct_url = fleet.engines[0].url
    async with aiohttp.ClientSession() as session:
        for bad in (-1, 1 << 70):
            body = {"model": "sim-model", "prompt": [bad, *range(100, 140)], "max_tokens": 2}
            async with session.post(f"{direct_url}/v1/completions", json=body) as resp:
                direct = resp.status, (await resp.json()).get("error", {}).get("type")
            async with session.post(f"{router.url}/v1/completions", json=body) as resp:
                routed = resp.status, (await resp.json()).get("error", {}).get("type")
                assert resp.headers.get("X-Hiveroute-Engine"), "it reached an engine"
            assert routed == direct, bad
