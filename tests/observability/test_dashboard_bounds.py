"""The dashboard's workflow list stays bounded however many workflows the router holds."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import RouterFactory
from tests.support.chromium import Chromium
from tests.support.fake_engine import FakeEngine


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as resp:
        return resp.status, await resp.json()


async def declare(http: aiohttp.ClientSession, base: str, count: int) -> None:
    for i in range(count):
        async with http.post(f"{base}/v1/workflows", json={"id": f"wf-{i:03d}"}) as resp:
            assert resp.status == 201


async def test_the_list_api_takes_a_limit(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory([fake_engines[0].url])
    await declare(http, r.url, 5)
    async with http.delete(f"{r.url}/v1/workflows/wf-004") as resp:
        assert resp.status == 200
    body = {"model": "m", "prompt": "x", "max_tokens": 1, "hiveroute": {"workflow_id": "wf-000"}}
    async with http.post(f"{r.url}/v1/completions", json=body) as resp:
        assert resp.status == 200  # wf-000 is now the most recently active

    status, full = await get(http, f"{r.url}/v1/workflows")
    assert status == 200 and full["total"] == 5
    assert [w["id"] for w in full["data"]] == [f"wf-{i:03d}" for i in range(5)]  # oldest first
    status, page = await get(http, f"{r.url}/v1/workflows?limit=3")
    assert status == 200 and page["total"] == 5
    assert page["data"][0]["id"] == "wf-000"  # active, most recent first
    assert len(page["data"]) == 3 and "wf-004" not in {w["id"] for w in page["data"]}  # ended
    for bad in ("0", "-1", "x", "10001", "%C2%B2", "9" * 5000):  # "²" is a digit to str
        status, err = await get(http, f"{r.url}/v1/workflows?limit={bad}")
        assert status == 400 and err["error"]["param"] == "limit"


@pytest.mark.services
async def test_the_dashboard_lists_100_and_counts_the_rest(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory([fake_engines[0].url])
    await declare(http, r.url, 103)
    async with Chromium(window=(1200, 900)) as browser:
        await browser.goto(f"{r.url}/dashboard?refresh=500")
        await browser.wait_for("document.querySelectorAll('tr.wf').length > 0", timeout_s=20)
        shown = await browser.evaluate(
            """(() => ({rows: document.querySelectorAll('tr.wf').length,
              more: document.querySelector('[data-field="workflows_more"]')?.getAttribute('data-value')}))()"""
        )
    assert shown == {"rows": 100, "more": "3"}
