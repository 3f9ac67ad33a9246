"""A wrong `events=` address is not silent: an engine that serves but sends no events is flagged."""

import logging

import aiohttp
import pytest
import zmq.asyncio

from hiveroute.kvindex.service import get_kv_events
from hiveroute.kvindex.staleness import EventStaleness
from tests.conftest import RouterFactory
from tests.kvindex.zmq_publisher import FakePublisher, stored, wait_until
from tests.support.fake_engine import FakeEngine
from tests.support.services import free_port


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_served_without_events_is_stale_once_until_an_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    watch = EventStaleness(stale_after_s=10.0, clock=clock)
    watch.track("e0", "tcp://127.0.0.1:5999")
    clock.t += 60
    assert watch.check({"e0": 0}) == []  # idle engines owe nothing
    watch.served("e0")
    clock.t += 9.9
    assert watch.check({"e0": 0}) == [] and not watch.is_stale("e0")
    watch.served("e0")  # later requests do not move the start of the wait
    clock.t += 0.1
    with caplog.at_level(logging.WARNING, logger="hiveroute.kvindex.events"):
        assert watch.check({"e0": 0}) == ["e0"]
        clock.t += 30
        assert watch.check({"e0": 0}) == []  # logged once
    assert watch.is_stale("e0") and not watch.received_any("e0")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "tcp://127.0.0.1:5999" in warnings[0].getMessage()
    assert watch.seconds_since_event("e0") == pytest.approx(100.0)

    assert watch.check({"e0": 1}) == []  # a batch arrived
    assert not watch.is_stale("e0") and watch.received_any("e0")
    assert watch.seconds_since_event("e0") == 0.0
    watch.served("e0")
    clock.t += 10
    assert watch.check({"e0": 1}) == ["e0"]  # a new episode warns again
    watch.forget("e0")
    assert watch.seconds_since_event("e0") is None and not watch.is_stale("e0")


def scrape_value(text: str, name: str, engine: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f'{name}{{engine="{engine}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_wrong_events_address_shows_in_metrics_and_dashboard(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    ctx = zmq.asyncio.Context()
    pub = FakePublisher(ctx)
    wrong = f"tcp://127.0.0.1:{free_port()}"  # nothing publishes there
    r = await router_factory(
        [f"{fake_engines[0].url},events={wrong}", f"{fake_engines[1].url},events={pub.endpoint}"],
        policy="round_robin",
    )
    try:
        service = get_kv_events(r.router.services)
        assert service is not None
        clock = Clock()
        service.staleness.clock = clock
        e_wrong, e_good = (e.url.removeprefix("http://") for e in fake_engines)
        for _ in range(2):
            body = {"model": "m", "prompt": "hello", "max_tokens": 1}
            async with http.post(f"{r.url}/v1/completions", json=body) as resp:
                assert resp.status == 200
        await pub.wait_subscribed()
        await pub.publish([stored([1], list(range(8)))])
        await wait_until(lambda: service.subscribers[e_good].stats.batches == 1)
        service.check_staleness()  # as the once-a-second loop does
        clock.t += 11

        async with http.get(f"{r.url}/metrics") as resp:
            text = await resp.text()
        assert scrape_value(text, "hiveroute_kv_events_stale", e_wrong) == 1.0
        assert scrape_value(text, "hiveroute_kv_events_stale", e_good) == 0.0
        assert scrape_value(text, "hiveroute_kv_event_age_seconds", e_good) == pytest.approx(11.0)

        async with http.get(f"{r.url}/dashboard/api/overview") as resp:
            engines = {e["name"]: e for e in (await resp.json())["engines"]}
        assert engines[e_wrong]["kv_events"]["stale"] is True
        assert engines[e_wrong]["kv_events"]["endpoint"] == wrong
        assert engines[e_wrong]["kv_events"]["received"] is False
        assert engines[e_good]["kv_events"]["stale"] is False
    finally:
        await pub.close()
        ctx.term()
