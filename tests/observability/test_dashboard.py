"""/dashboard in a real headless Chromium: what it shows must be what the APIs return."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hiveroute.assembly import Router, assemble
from hiveroute.config import RouterConfig
from tests.support.chromium import Chromium
from tests.support.fake_engine import FakeEngine
from tests.support.router_app import serve_router

ADMIN = "admin-key-0123"
TENANT = "tenant-key-0123"
WORKFLOW = "wf-review-42"


@pytest.fixture
async def dashboard_router(
    fake_engines: list[FakeEngine],
) -> AsyncIterator[tuple[str, Router]]:
    for i, engine in enumerate(fake_engines):
        engine.behaviour.stream_chunks = 8
        engine.behaviour.stall_before_response_s = 0.03 * (i + 1)
        engine.behaviour.running = i + 1
    config = RouterConfig(
        engine=[e.url for e in fake_engines],
        host="127.0.0.1",
        port=0,
        health_interval_s=0.2,
        policy="round_robin",
        admin_key=ADMIN,
        api_keys={TENANT: "acme"},
    ).validate()
    served = await serve_router(assemble(config))
    try:
        yield served.url, served.router
    finally:
        await served.stop()


async def agent_call(
    http: aiohttp.ClientSession, url: str, agent: str, role: str, stage: str
) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"{role} step of the shared task"}],
        "stream": True,
        "hiveroute": {
            "workflow_id": WORKFLOW,
            "agent_id": agent,
            "agent_role": role,
            "stage": stage,
        },
    }
    headers = {"Authorization": f"Bearer {TENANT}", "Content-Type": "application/json"}
    async with http.post(f"{url}/v1/chat/completions", data=json.dumps(body), headers=headers) as r:
        assert r.status == 200, await r.text()
        await r.read()


async def run_workflow(http: aiohttp.ClientSession, url: str) -> None:
    """Planner, then three executors at once, then a validator: hand-offs between them."""
    await agent_call(http, url, "planner-1", "planner", "plan")
    await asyncio.sleep(0.02)
    await asyncio.gather(
        *(agent_call(http, url, f"executor-{i}", "executor", "execute") for i in range(1, 4))
    )
    await asyncio.sleep(0.02)
    await agent_call(http, url, "validator-1", "validator", "validate")


async def admin_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url, headers={"Authorization": f"Bearer {ADMIN}"}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def close(shown: Any, expected: Any) -> bool:
    """The DOM carries the API's number as text (data-value); JS and Python print floats alike."""
    if expected is None:
        return shown in ("", None)
    if isinstance(expected, bool):
        return shown == str(expected).lower()
    if isinstance(expected, (int, float)):
        return float(shown) == float(expected)
    return bool(shown == str(expected))


PAGE_STATE = """(() => {
  const q = (s) => [...document.querySelectorAll(s)];
  const val = (root, f) => { const n = root.querySelector(`[data-field="${f}"]`); return n ? n.getAttribute("data-value") : null; };
  return {
    loaded: Number(document.body.getAttribute("data-loaded") || 0),
    engines: q("[data-engine].engine").map((e) => ({name: e.getAttribute("data-engine"),
      requests: val(e, "requests"), cached_tokens: val(e, "cached_tokens"), hit_rate: val(e, "hit_rate"),
      kv_usage: val(e, "kv_usage"), running: val(e, "running"), healthy: val(e, "healthy")})),
    totals: Object.fromEntries(q("#totals [data-field]").map((n) => [n.getAttribute("data-field"), n.getAttribute("data-value")])),
    workflows: q("tr.wf").map((r) => ({id: r.getAttribute("data-workflow-id"), requests: val(r, "requests"), agents: val(r, "agents")})),
    selected: document.getElementById("workflow-section").getAttribute("data-workflow-id"),
    bars: q("#timeline-svg g.req").map((g) => ({id: g.getAttribute("data-request-id"), engine: g.getAttribute("data-engine"),
      ttft_s: g.getAttribute("data-ttft-s"), cached_tokens: g.getAttribute("data-cached-tokens"), prompt_tokens: g.getAttribute("data-prompt-tokens")})),
    rows: q("#request-table tbody tr").map((r) => Object.fromEntries(
      [...r.querySelectorAll("[data-field]")].map((n) => [n.getAttribute("data-field"), n.getAttribute("data-value")]))),
    handoffs: q("#timeline-svg g.handoff-g").map((g) => ({from: g.getAttribute("data-from"), to: g.getAttribute("data-to"), latency_s: g.getAttribute("data-latency-s")})),
    wfTotals: Object.fromEntries(q("#workflow-totals [data-field]").map((n) => [n.getAttribute("data-field"), n.getAttribute("data-value")])),
    error: document.getElementById("status").className.includes("err") ? document.getElementById("status").textContent : null,
  };
})()"""


@pytest.mark.services
async def test_dashboard_shows_what_the_apis_return(
    dashboard_router: tuple[str, Router], http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    url, _router = dashboard_router
    await run_workflow(http, url)
    # The page and its API need the admin key; a tenant's key is not enough.
    async with http.get(f"{url}/dashboard") as r:
        assert r.status == 401
    async with http.get(f"{url}/dashboard?key={TENANT}") as r:
        assert r.status == 403
    async with http.get(f"{url}/dashboard/api/overview") as r:
        assert r.status == 401

    async with Chromium(window=(1400, 1000)) as browser:
        await browser.goto(f"{url}/dashboard?key={ADMIN}&workflow={WORKFLOW}&refresh=500")
        await browser.wait_for(
            "document.querySelectorAll('#timeline-svg g.req').length === 5", timeout_s=20
        )
        shown = await browser.evaluate(PAGE_STATE)
        overview = await admin_json(http, f"{url}/dashboard/api/overview")
        listing = await admin_json(http, f"{url}/v1/workflows")
        # With API keys the workflow lives in its tenant's namespace; the admin names it.
        (entry,) = [w for w in listing["data"] if w["id"] == WORKFLOW]
        scope = f"?tenant={entry['tenant']}" if entry.get("tenant") else ""
        workflow = await admin_json(http, f"{url}/v1/workflows/{WORKFLOW}{scope}")
        # The fleet charts are rates between polls: more traffic while the page is open shows.
        await run_workflow(http, url)
        rps = await browser.wait_for(
            "Number(document.querySelector('[data-field=\"chart-rps\"]')"
            "?.getAttribute('data-value') || 0)",
            timeout_s=10,
        )
        await browser.wait_for(
            "document.querySelectorAll('#timeline-svg g.req').length === 10", timeout_s=10
        )
        shot = Path(os.environ.get("HIVEROUTE_SCREENSHOT_DIR", tmp_path)) / "dashboard.png"
        await browser.screenshot(shot)

    assert shown["error"] is None and shown["loaded"] >= 1
    # Engines: one card each, with the load and cache numbers of /dashboard/api/overview.
    by_name = {e["name"]: e for e in overview["engines"]}
    assert sorted(e["name"] for e in shown["engines"]) == sorted(by_name)
    for card in shown["engines"]:
        api = by_name[card["name"]]
        for field in ("requests", "cached_tokens", "hit_rate", "kv_usage", "running", "healthy"):
            assert close(card[field], api[field]), (card["name"], field, card[field], api[field])
    assert sum(e["requests"] for e in overview["engines"]) == 5
    assert close(shown["totals"]["hit_rate"], overview["totals"]["hit_rate"])
    # Workflows: the list is GET /v1/workflows.
    listed = {w["id"]: w for w in listing["data"]}
    assert {w["id"] for w in shown["workflows"]} == set(listed)
    for row in shown["workflows"]:
        assert close(row["requests"], listed[row["id"]]["requests"])
        assert close(row["agents"], listed[row["id"]]["agents"])
    # The timeline and the table draw exactly GET /v1/workflows/{id}.
    assert shown["selected"] == WORKFLOW
    requests = workflow["requests"]
    assert len(requests) == 5
    bars = {b["id"]: b for b in shown["bars"]}
    rows = {r["request_id"]: r for r in shown["rows"]}
    assert set(bars) == set(rows) == {r["request_id"] for r in requests}
    for req in requests:
        bar, row = bars[req["request_id"]], rows[req["request_id"]]
        # streamed without stream_options.include_usage, as agents send them: the router asked
        # the engine for usage itself, so every request shows its prompt and cached tokens
        assert req["prompt_tokens"] and req["cached_tokens"] is not None, req
        assert float(bar["prompt_tokens"]) > 0 and bar["cached_tokens"] not in ("", None)
        assert bar["engine"] == req["engine"] and row["engine"] == req["engine"]
        for field in ("ttft_s", "cached_tokens", "prompt_tokens"):
            assert close(bar[field], req[field]), (field, bar[field], req[field])
        for field in ("ttft_s", "started_at", "cached_tokens", "cross_agent_cached_tokens"):
            assert close(row[field], req[field]), (field, row[field], req[field])
        assert row["agent_id"] == req["agent_id"] and row["agent_role"] == req["agent_role"]
    assert {(h["from"], h["to"]) for h in shown["handoffs"]} == {
        (h["from_request_id"], h["to_request_id"]) for h in workflow["handoffs"]
    }
    for drawn in shown["handoffs"]:
        api_h = next(h for h in workflow["handoffs"] if h["to_request_id"] == drawn["to"])
        assert close(drawn["latency_s"], api_h["latency_s"])
    assert workflow["handoffs"], "planner -> executors -> validator has hand-offs"
    for field in ("workflow_ttft_s", "completion_time_s", "hit_rate", "cached_tokens"):
        assert close(shown["wfTotals"][field], workflow["totals"][field]), field
    assert rps > 0
    assert shot.stat().st_size > 10_000  # a real rendering, not a blank page
