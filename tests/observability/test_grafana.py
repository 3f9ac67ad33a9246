"""The Grafana dashboard: generated from one description, and every query has data in a real
Prometheus scraping a router under agent traffic and its engines."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from hiveroute.config import RouterConfig, load_config
from hiveroute.gateway.router import Router
from hiveroute.observability.grafana import dashboard, render
from hiveroute.observability.metrics import RouterMetrics
from hiveroute.sim.config import SimConfig
from hiveroute.sim.fleet import SimFleet
from tests.support.prometheus import Prometheus
from tests.support.router_app import serve_router

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "hiveroute.json"
# What Grafana substitutes before sending a query: all engines, and a window of a few scrapes.
SHARED = "A shared context every agent reads first, long enough to fill a few blocks. " * 8
VARIABLES = {"$__rate_interval": "10s", "$engine": ".*"}


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel, rows' nested panels included."""
    found = []
    stack = list(board["panels"])
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    return found


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def test_dashboard_file_is_the_generated_one() -> None:
    assert json.loads(DASHBOARD.read_text()) == dashboard(), (
        "regenerate: python -m hiveroute.observability.grafana > deploy/grafana/hiveroute.json"
    )
    assert DASHBOARD.read_text() == render()


def test_dashboard_is_well_formed() -> None:
    board = json.loads(DASHBOARD.read_text())
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["targets"], panel["title"]
    queries = " ".join(expr for _, expr in panel_queries(board))
    on_board = set(re.findall(r"\b((?:hiveroute_|vllm:)[a-z0-9_:]+)", queries))
    # Every series the router exports has a panel (histograms through their buckets).
    for family in RouterMetrics().registry.collect():
        suffix = "_bucket" if family.type == "histogram" else ""
        suffix = "_total" if family.type == "counter" else suffix
        assert family.name + suffix in on_board, family.name
    # And the engines' own vLLM series.
    for required in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "hiveroute_kv_index_blocks",
        "hiveroute_kv_events_total",
        "hiveroute_kv_event_gaps_total",
        "hiveroute_kv_event_lag_seconds",
    ):
        assert required in on_board, required


def test_provisioning_files_point_at_the_dashboard() -> None:
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert datasources["datasources"][0]["type"] == "prometheus"
    providers = yaml.safe_load((provisioning / "dashboards" / "hiveroute.yaml").read_text())
    assert providers["providers"][0]["type"] == "file"
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    assert set(jobs) == {"hiveroute", "vllm"}
    # the engines' `instance` must equal the router's `engine` label for the same engines
    # (deploy/local gives the router http://127.0.0.1:8100, ...), or the engine filter blanks panels
    local = load_config({"config": str(ROOT / "deploy" / "local" / "hiveroute.yaml")}, env={})
    targets = [t for c in jobs["vllm"]["static_configs"] for t in c["targets"]]
    assert targets == [spec.name for spec in local.engine_specs]


async def agent_traffic(
    http: aiohttp.ClientSession, url: str, model: str, stop: asyncio.Event
) -> int:
    """Workflows of a planner, two executors and a validator, ended when done; until `stop`."""
    count = itertools.count()
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        wf = f"wf-{next(count)}"

        async def call(agent: str, role: str, stream: bool, wf: str = wf) -> None:
            body = {
                "model": model,
                "prompt": f"{SHARED} Workflow {wf}: the {role}'s part.",
                "max_tokens": 6,
                "stream": stream,
                "hiveroute": {"workflow_id": wf, "agent_id": agent, "agent_role": role},
            }
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()

        await call("planner", "planner", True)
        await asyncio.gather(call("exec-1", "executor", True), call("exec-2", "executor", False))
        await call("validator", "validator", True)
        async with http.delete(f"{url}/v1/workflows/{wf}") as resp:
            assert resp.status == 200
    return next(count)


async def empty_queries(prom: Prometheus, queries: list[tuple[str, str]]) -> list[str]:
    """The queries that return no series, or only NaN (a histogram with nothing in the window)."""
    empty = []
    for title, expr in queries:
        result = await prom.query(substitute(expr))
        values = [float(series["value"][1]) for series in result]
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{title}: {expr}")
    return empty


@pytest.fixture
async def sim_fleet() -> Any:
    """Two simulated engines with KV events, on free ports, fast enough for a short test."""
    fleet = SimFleet(SimConfig(engines=2, base_port=0, events_base_port=0, preset="fast"))
    await fleet.start()
    try:
        yield fleet
    finally:
        await fleet.stop()


@pytest.mark.services
async def test_every_panel_query_returns_data_from_a_real_prometheus(
    sim_fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    config = RouterConfig(
        engine=sim_fleet.engine_spec_texts(),
        host="127.0.0.1",
        port=0,
        health_interval_s=0.5,
        policy="round_robin",
    ).validate()
    served = await serve_router(Router(config))
    router_target = served.url.removeprefix("http://")
    engine_targets = [e.url.removeprefix("http://") for e in sim_fleet.engines]
    prom = Prometheus({"hiveroute": [router_target], "vllm": engine_targets}, scrape_interval_s=0.5)
    queries = panel_queries(json.loads(DASHBOARD.read_text()))
    stop = asyncio.Event()
    model = sim_fleet.config.model_name()
    traffic = asyncio.create_task(agent_traffic(http, served.url, model, stop))
    try:
        await prom.start()
        # Every query Prometheus accepts (a typo in PromQL fails here, not in Grafana).
        for _, expr in queries:
            await prom.query(substitute(expr))
        deadline = time.monotonic() + 30
        missing = await empty_queries(prom, queries)
        while missing and time.monotonic() < deadline:
            await asyncio.sleep(1)
            missing = await empty_queries(prom, queries)
        assert not missing, "panels without data:\n" + "\n".join(missing)
        assert all((await prom.targets_up()).values())
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(traffic, 10)
        await prom.stop()
        await served.stop()
    assert traffic.result() > 0
