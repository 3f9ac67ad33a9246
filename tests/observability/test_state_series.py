"""The shared-state panels read 0 from the first scrape, not "No data" until an outage."""

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hiveroute.config import RouterConfig
from hiveroute.gateway.router import Router
from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine

OUTAGE_SERIES = {
    "hiveroute_state_errors_total": [{"reason": "connection"}, {"reason": "timeout"}],
    "hiveroute_state_local_operations_total": [{}],
    "hiveroute_state_reconciled_keys_total": [
        {"result": "applied"},
        {"result": "conflict"},
        {"result": "restored"},
    ],
}


def zero_samples(text: str, backend: str) -> dict[str, list[dict[str, str]]]:
    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in OUTAGE_SERIES and sample.labels.get("backend") == backend:
                assert sample.value == 0, sample
                labels = {k: v for k, v in sample.labels.items() if k != "backend"}
                found.setdefault(sample.name, []).append(labels)
    return found


async def test_state_outage_series_are_zero_at_start(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory([fake_engines[0].url])
    async with http.get(f"{r.url}/metrics") as resp:
        text = await resp.text()
    assert zero_samples(text, "memory") == OUTAGE_SERIES


@pytest.mark.parametrize("state", ["redis://127.0.0.1:9/0"])
def test_a_redis_router_exports_them_before_it_connects(state: str) -> None:
    router = Router(RouterConfig(engine=["http://127.0.0.1:9"], state=state).validate())
    text = router.metrics.render().decode()
    assert zero_samples(text, "redis") == OUTAGE_SERIES
