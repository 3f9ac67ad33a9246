"""Engine faults through the router, driven by the simulator's fault knobs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from hiveroute.sim import SimConfig, SimFleet
from tests.conftest import RouterFactory


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    fleet = SimFleet(SimConfig(engines=2, base_port=0, events_base_port=0, preset="fast"))
    await fleet.start()
    yield fleet
    await fleet.stop()


def body(stream: bool = True, max_tokens: int = 8) -> dict[str, object]:
    return {
        "model": fleet_model(),
        "prompt": "the agent plans the task",
        "max_tokens": max_tokens,
        "stream": stream,
    }


def fleet_model() -> str:
    from hiveroute.sim.presets import get_preset

    return get_preset("fast").model


def engine_name(url: str) -> str:
    return url.removeprefix("http://")


async def test_engine_dying_mid_stream(
    fleet: SimFleet, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    dying, healthy = fleet.engines
    dying.faults.update({"drop_fraction": 1.0, "drop_after_tokens": 2})
    router = await router_factory(
        [e.url for e in fleet.engines], policy="round_robin", health_interval_s=60
    )
    served_by: list[str] = []
    for _ in range(2):  # round robin: one of the two lands on the dying engine
        async with http.post(f"{router.url}/v1/completions", json=body()) as resp:
            assert resp.status == 200
            served_by.append(resp.headers["X-Hiveroute-Engine"])
            text = (await resp.read()).decode()
        events = [e.removeprefix("data: ") for e in text.split("\n\n") if e.strip()]
        assert events[-1] == "[DONE]", "every stream ends, broken or not"
        if resp.headers["X-Hiveroute-Engine"] == engine_name(dying.url):
            error = json.loads(events[-2])["error"]
            assert error["code"] == "upstream_disconnected"
            assert sum(1 for e in events if '"text"' in e) == 2  # tokens before the cut arrived
        else:
            assert '"error"' not in text
    assert engine_name(dying.url) in served_by
    pool = router.router.pool
    assert not pool.get(engine_name(dying.url)).healthy  # type: ignore[union-attr]
    for _ in range(4):  # new requests go elsewhere
        async with http.post(f"{router.url}/v1/completions", json=body(stream=False)) as resp:
            assert resp.status == 200
            assert resp.headers["X-Hiveroute-Engine"] == engine_name(healthy.url)


async def test_engine_hanging_before_first_token_is_retried_elsewhere(
    fleet: SimFleet, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    hung, healthy = fleet.engines
    hung.faults.update({"stall_first_token_s": 60})
    router = await router_factory(
        [e.url for e in fleet.engines],
        policy="round_robin",
        first_byte_timeout_s=0.5,
        health_interval_s=60,
    )
    for _ in range(3):
        async with http.post(f"{router.url}/v1/completions", json=body()) as resp:
            assert resp.status == 200
            assert resp.headers["X-Hiveroute-Engine"] == engine_name(healthy.url)
            assert (await resp.read()).rstrip().endswith(b"[DONE]")
    metrics = await (await http.get(f"{router.url}/metrics")).text()
    assert f'hiveroute_retries_total{{engine="{engine_name(hung.url)}"}} 1.0' in metrics


async def test_failing_engine_answers_are_retried_or_passed_through(
    fleet: SimFleet, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    bad, good = fleet.engines
    bad.faults.update({"fail_fraction": 1.0, "fail_status": 503})
    router = await router_factory(
        [e.url for e in fleet.engines], policy="round_robin", health_interval_s=60
    )
    for _ in range(3):  # 503 means "try elsewhere"
        async with http.post(f"{router.url}/v1/completions", json=body(stream=False)) as resp:
            assert resp.status == 200 and resp.headers["X-Hiveroute-Engine"] == engine_name(
                good.url
            )


async def test_every_engine_down_gives_503_at_once_without_pile_up(
    fleet: SimFleet, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    router = await router_factory([e.url for e in fleet.engines], health_interval_s=0.2)
    await fleet.stop()
    statuses = await asyncio.gather(
        *(http.post(f"{router.url}/v1/completions", json=body()) for _ in range(50))
    )
    assert {r.status for r in statuses} == {503}
    for r in statuses:
        assert (await r.json())["error"]["code"] == "no_engine_available"
    assert router.router.admission.in_flight == 0 and router.router.admission.waiting == 0
    assert all(e.load.in_flight == 0 for e in router.router.pool.engines)


async def test_slow_health_checks_do_not_turn_overload_into_an_outage(
    router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    from tests.support.fake_engine import FakeEngine

    engines = [FakeEngine(), FakeEngine()]
    for engine in engines:
        await engine.start()
    try:
        router = await router_factory([e.url for e in engines], health_interval_s=0.1)
        router.router.engine_client.timeouts.health_s = 0.2
        for engine in engines:
            engine.behaviour.health_stall_s = 1.0  # overloaded: health answers late
        pool = router.router.pool
        for _ in range(100):
            if not any(e.healthy for e in pool.engines):
                break
            await asyncio.sleep(0.05)
        assert not any(e.healthy for e in pool.engines)
        assert all(e.down_but_reachable for e in pool.engines)
        resp = await http.post(f"{router.url}/v1/completions", json={"model": "m", "prompt": "p"})
        assert resp.status == 200, "slow engines still serve when nothing better exists"
        health = await (await http.get(f"{router.url}/health")).json()
        assert health["panic_routings"] >= 1
        await engines[0].stop()  # now one engine is dead, not slow
        await engines[1].stop()
        for _ in range(100):
            if not any(e.down_but_reachable for e in pool.engines):
                break
            await asyncio.sleep(0.05)
        resp = await http.post(f"{router.url}/v1/completions", json={"model": "m", "prompt": "p"})
        assert resp.status == 503, "unreachable engines are not tried"
    finally:
        for engine in engines:
            await engine.stop()


async def test_tenants_cannot_time_each_others_cache(
    fleet: SimFleet, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    """Same prompt, same engine: agents of one tenant hit each other's cache, another tenant
    never does (so it cannot learn the prompt from a faster first token)."""
    keys = {"key-tenant-a-000": "a", "key-tenant-a-111": "a", "key-tenant-b-000": "b"}
    router = await router_factory([fleet.engines[0].url], api_keys=keys)
    prompt = "confidential plan of tenant a " * 40
    cached: dict[str, int] = {}
    for key in ("key-tenant-a-000", "key-tenant-a-111", "key-tenant-b-000"):
        request = {"model": fleet_model(), "prompt": prompt, "max_tokens": 1}
        headers = {"Authorization": f"Bearer {key}"}
        async with http.post(f"{router.url}/v1/completions", json=request, headers=headers) as resp:
            assert resp.status == 200
            cached[key] = (await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached["key-tenant-a-000"] == 0
    assert cached["key-tenant-a-111"] > 0, "agents of one tenant share their cache"
    assert cached["key-tenant-b-000"] == 0, "another tenant never hits it"


async def test_an_engine_whose_host_does_not_answer_connecting_is_down_not_slow(
    router_factory: RouterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host that drops packets (a lost node, a pod IP nobody answers) times out connecting,
    and aiohttp's connect timeout is a TimeoutError too: it was taken for an overloaded
    engine, kept as a last resort, and every request then waited for a connect to fail."""
    from hiveroute.engines.client import EngineUnreachable
    from tests.support.fake_engine import FakeEngine

    engine = FakeEngine()
    await engine.start()
    try:
        router = await router_factory([engine.url], health_interval_s=60)
        client = router.router.engine_client
        [target] = router.router.pool.engines

        async def no_host(*args: object, **kwargs: object) -> None:
            raise aiohttp.ConnectionTimeoutError("connecting timed out")

        monkeypatch.setattr(aiohttp.ClientSession, "_request", no_host)
        with pytest.raises(EngineUnreachable) as raised:
            await client.send(target, "/v1/completions", b"{}", {}, stream=False)
        assert raised.value.slow is False
        for _ in range(router.router.pool.failures_to_down):
            await router.router.pool.check(target)
        assert not target.healthy and not target.down_but_reachable
    finally:
        await engine.stop()


async def test_a_models_list_of_another_shape_is_a_failed_check_not_a_crash(
    router_factory: RouterFactory,
) -> None:
    from tests.support.fake_engine import FakeEngine

    engine = FakeEngine()
    await engine.start()
    try:
        router = await router_factory([engine.url], health_interval_s=60)
        [target] = router.router.pool.engines
        engine.behaviour.models_body = [{"id": "m"}]  # a JSON list, not {"data": [...]}
        for _ in range(router.router.pool.failures_to_down):
            await router.router.pool.check(target)  # raised AttributeError out of the round
        assert not target.healthy
    finally:
        await engine.stop()


async def test_an_engine_that_cuts_a_whole_answer_short_is_a_502_and_taken_out(
    router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    """A non-streamed answer whose connection breaks mid-body was an 'internal error' (500,
    a traceback), and the engine stayed in: it is the engine's failure, said as such."""
    from tests.support.fake_engine import FakeEngine

    engine = FakeEngine()
    await engine.start()
    try:
        router = await router_factory([engine.url], health_interval_s=60)
        engine.behaviour.die_mid_body = True
        body = {"model": "m", "prompt": "p", "max_tokens": 3}
        async with http.post(f"{router.url}/v1/completions", json=body) as resp:
            assert resp.status == 502
            error = (await resp.json())["error"]
        assert error["type"] == "upstream_error" and "failed before its answer" in error["message"]
        [target] = router.router.pool.engines
        assert not target.healthy and target.load.in_flight == 0
    finally:
        await engine.stop()
