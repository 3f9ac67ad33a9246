"""The router's own metrics, read back from /metrics after real traffic through fake engines."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hiveroute.config import RouterConfig
from hiveroute.errors import ConfigError
from hiveroute.observability.metrics import RoleLabels, RouterMetrics
from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


async def completion(
    http: aiohttp.ClientSession, url: str, *, stream: bool, role: str | None = None
) -> None:
    headers = {"Content-Type": "application/json"}
    if role is not None:
        headers["X-Agent-Role"] = role
    body = {"model": "m", "prompt": "p", "stream": stream}
    async with http.post(f"{url}/v1/completions", data=json.dumps(body), headers=headers) as r:
        assert r.status == 200
        await r.read()


def test_roles_map_to_a_bounded_set() -> None:
    roles = RoleLabels(["Planner", "executor"])
    assert roles("planner") == "planner"
    assert roles("PLANNER") == "planner"
    assert roles("executor") == "executor"
    assert roles("attacker-controlled-" + "x" * 100) == "other"
    assert roles(None) == "none"
    assert roles("") == "none"


def test_every_series_is_hiveroute_prefixed() -> None:
    metrics = RouterMetrics()
    for family in text_string_to_metric_families(metrics.render().decode()):
        assert family.name.startswith("hiveroute_"), family.name


async def test_stream_records_ttft_itl_tokens_and_roles(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    engine.behaviour.stream_chunks = 6
    router = await router_factory([engine.url], metrics_roles=["planner", "executor"])
    await completion(http, router.url, stream=True, role="planner")
    await completion(http, router.url, stream=True, role="someone-else")
    await completion(http, router.url, stream=False)
    async with http.get(f"{router.url}/metrics") as r:
        text = await r.text()
    name = f"127.0.0.1:{engine.port}"
    policy = router.router.policy.name
    # Two streamed requests give two ITL observations; the non-streamed one gives none.
    assert (
        value(text, "hiveroute_inter_token_latency_seconds_count", engine=name, policy=policy) == 2
    )
    itl_sum = value(text, "hiveroute_inter_token_latency_seconds_sum", engine=name, policy=policy)
    assert itl_sum is not None and itl_sum >= 0
    assert value(text, "hiveroute_ttft_seconds_count", engine=name, policy=policy) == 3
    # FakeEngine reports 10 prompt tokens, 4 cached and `stream_chunks` generated per request.
    assert value(text, "hiveroute_prompt_tokens_total", engine=name) == 30
    assert value(text, "hiveroute_cached_tokens_total", engine=name) == 12
    assert value(text, "hiveroute_completion_tokens_total", engine=name) == 18
    assert value(text, "hiveroute_agent_requests_total", role="planner") == 1
    assert value(text, "hiveroute_agent_requests_total", role="other") == 1
    assert value(text, "hiveroute_agent_requests_total", role="none") == 1
    assert value(text, "hiveroute_agent_cached_tokens_total", role="planner") == 4
    assert value(text, "hiveroute_agent_ttft_seconds_count", role="other") == 1
    # Defined for the workflow registry and the cross-agent accounting to observe.
    for metric in (
        "hiveroute_workflow_ttft_seconds_count",
        "hiveroute_workflow_completion_seconds_count",
        "hiveroute_handoff_latency_seconds_count",
    ):
        assert value(text, metric) == 0


async def test_itl_is_the_mean_gap_between_data_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six events 10 ms apart: ITL is their span over five gaps, whatever the chunking."""
    from hiveroute.gateway import proxy
    from tests.support.relay import relay

    times = iter([1.0 + 0.01 * i for i in range(1, 10)])
    rest = [b"data: {}\n\ndata: {}\n\n", b"data: {}\n\n", b"data: {}\n\n"]
    rest.append(b"data: {}\n\ndata: [DONE]\n\n")
    monkeypatch.setattr(proxy.time, "perf_counter", lambda: next(times))
    _, result = await relay(monkeypatch, b"data: {}\n\n", rest)
    # Events at 1.00 (1), 1.01 (2), 1.02 (1), 1.03 (1), 1.04 (1 + DONE): 6 events over 0.04 s.
    assert result.ttft_s == 0.5
    assert result.itl_s is not None and abs(result.itl_s - 0.04 / 5) < 1e-9


def test_config_rejects_too_many_roles_and_bad_sample_ratio() -> None:

    with pytest.raises(ConfigError, match="at most"):
        RouterConfig(metrics_roles=[f"r{i}" for i in range(100)]).validate()
    with pytest.raises(ConfigError, match="otlp_sample_ratio"):
        RouterConfig(otlp_sample_ratio=1.5).validate()
    with pytest.raises(ConfigError, match="otlp_endpoint"):
        RouterConfig(otlp_endpoint="localhost:4318").validate()


async def test_dashboard_overview_counts_requests_and_cache_per_engine(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    router = await router_factory([e.url for e in fake_engines], policy="round_robin")
    for _ in range(3):
        await completion(http, router.url, stream=False)
    async with http.get(f"{router.url}/dashboard/api/overview") as r:
        assert r.status == 200
        overview = await r.json()
    async with http.get(f"{router.url}/dashboard") as r:
        assert r.status == 200 and r.content_type == "text/html"
        assert "default-src 'none'" in r.headers["Content-Security-Policy"]
        assert "<script>" in await r.text()
    engines = {e["name"]: e for e in overview["engines"]}
    assert set(engines) == {f"127.0.0.1:{e.port}" for e in fake_engines}
    assert sorted(e["requests"] for e in engines.values()) == [1, 2]
    assert overview["totals"] == {
        "engines": 2,
        "healthy_engines": 2,
        "in_flight": 0,
        "requests": 3,
        "prompt_tokens": 30,
        "cached_tokens": 12,
        "cross_agent_cached_tokens": 0,
        "hit_rate": 0.4,
        "cross_agent_hit_rate": 0.0,
    }
    assert all(e["kv_usage"] == 0.25 and e["hit_rate"] == 0.4 for e in engines.values())


async def test_workflow_registry_observes_workflow_ttft_handoffs_and_completion(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    router = await router_factory([fake_engines[0].url])

    async def agent(agent_id: str) -> None:
        body = {
            "model": "m",
            "prompt": "p",
            "hiveroute": {"workflow_id": "wf-m", "agent_id": agent_id},
        }
        async with http.post(f"{router.url}/v1/completions", json=body) as r:
            assert r.status == 200

    async def metric(name: str) -> float | None:
        async with http.get(f"{router.url}/metrics") as r:
            return value(await r.text(), name)

    await agent("planner")
    await agent("executor")  # a hand-off from the planner
    # The registry records requests off the request path: wait (bounded) for the second one.
    for _ in range(100):
        if await metric("hiveroute_handoff_latency_seconds_count"):
            break
        await asyncio.sleep(0.05)
    assert await metric("hiveroute_handoff_latency_seconds_count") == 1
    assert await metric("hiveroute_workflow_ttft_seconds_count") == 1
    assert await metric("hiveroute_workflow_completion_seconds_count") == 0
    async with http.delete(f"{router.url}/v1/workflows/wf-m") as r:
        assert r.status == 200
    assert await metric("hiveroute_workflow_completion_seconds_count") == 1
    async with http.get(f"{router.url}/v1/workflows/wf-m") as r:
        totals = (await r.json())["totals"]
    completion_sum = await metric("hiveroute_workflow_completion_seconds_sum")
    assert completion_sum is not None and abs(completion_sum - totals["completion_time_s"]) < 1e-3


def test_an_engine_that_leaves_the_pool_leaves_no_gauge_behind() -> None:
    """`hiveroute_engine_up` of a departed engine went on saying 1: `sum()` over it counted
    engines that were gone, and a churning pool grew the series for good."""
    from hiveroute.assembly import assemble
    from hiveroute.config import RouterConfig

    config = RouterConfig(engine=["http://127.0.0.1:8100", "http://127.0.0.1:8101"], policy="kv")
    router = assemble(config.validate())
    metrics, name = router.metrics, "127.0.0.1:8100"
    metrics.engine_up.labels(name).set(1)
    metrics.in_flight.labels(name).set(2)
    assert metrics.value("hiveroute_engine_up", {"engine": name}) == 1
    router.pool.remove(name)
    rendered = metrics.render().decode()
    assert f'hiveroute_engine_up{{engine="{name}"}}' not in rendered
    assert f'hiveroute_in_flight_requests{{engine="{name}"}}' not in rendered
