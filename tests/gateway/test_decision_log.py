"""The decision log: a cost-based policy's request line prices every candidate in its parts,
so a run's logs show why each request went where it did (`--router-log-level info`)."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from tests.conftest import RouterFactory
from tests.support.access import access_lines
from tests.support.fake_engine import FakeEngine

BODY = {"model": "m", "prompt": "a prompt of several words " * 20, "max_tokens": 3}


@pytest.mark.parametrize("policy", ["workflow", "kv"])
async def test_a_cost_based_decision_logs_each_candidates_price(
    policy: str,
    fake_engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hiveroute.access")
    r = await router_factory([e.url for e in fake_engines[:2]], policy=policy)
    async with http.post(f"{r.url}/v1/completions", json=BODY, headers={"X-Request-Id": "d-1"}):
        pass
    [line] = access_lines(caplog, "d-1")
    prices = line["cost_ms"]
    assert set(prices) == {f"127.0.0.1:{e.port}" for e in fake_engines[:2]}
    chosen = prices[line["engine"]]
    assert chosen["total"] == min(p["total"] for p in prices.values())
    parts = ("ttft", "delay", "evict", "lost")
    assert chosen["total"] == pytest.approx(sum(chosen[k] for k in parts), abs=0.01)
    assert chosen["ttft"] > 0


async def test_a_policy_without_prices_logs_none(
    fake_engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hiveroute.access")
    r = await router_factory([fake_engines[0].url], policy="round_robin")
    async with http.post(f"{r.url}/v1/completions", json=BODY, headers={"X-Request-Id": "d-2"}):
        pass
    [line] = access_lines(caplog, "d-2")
    assert "cost_ms" not in line
