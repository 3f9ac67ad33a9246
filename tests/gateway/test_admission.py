import asyncio

import aiohttp
import pytest

from hiveroute.errors import TooManyRequests
from hiveroute.gateway.admission import AdmissionController
from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine


async def test_slots_are_handed_over_in_fifo_order() -> None:
    control = AdmissionController(max_in_flight=1, queue_depth=5, timeout_s=5)
    order: list[int] = []
    gate = asyncio.Event()

    async def worker(i: int) -> None:
        async with control.admit():
            order.append(i)
            await gate.wait()

    tasks = [asyncio.create_task(worker(i)) for i in range(4)]
    await asyncio.sleep(0.05)
    assert control.in_flight == 1 and control.waiting == 3
    gate.set()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3]
    assert control.in_flight == 0 and control.waiting == 0


async def test_full_queue_refuses_at_once_and_timeout_refuses_later() -> None:
    control = AdmissionController(max_in_flight=1, queue_depth=1, timeout_s=0.2)
    hold = asyncio.Event()

    async def holder() -> None:
        async with control.admit():
            await hold.wait()

    first = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    queued = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    with pytest.raises(TooManyRequests, match="capacity"):
        async with control.admit():
            pass
    with pytest.raises(TooManyRequests, match="waited"):
        await queued
    hold.set()
    await first
    assert control.in_flight == 0 and control.waiting == 0


async def test_a_cancelled_waiter_does_not_leak_its_slot() -> None:
    control = AdmissionController(max_in_flight=1, queue_depth=4, timeout_s=5)
    hold = asyncio.Event()

    async def holder() -> None:
        async with control.admit():
            await hold.wait()

    first = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    gone = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    gone.cancel()
    hold.set()
    await first
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert control.in_flight == 0
    async with control.admit():
        assert control.in_flight == 1


async def test_router_answers_429_with_retry_after_when_full(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    engine.behaviour.hold_after_chunk = 0
    router = await router_factory(
        [engine.url], max_in_flight=1, admission_queue_depth=0, admission_timeout_s=5
    )
    body = {"model": "m", "prompt": "p", "stream": True}
    held = await http.post(f"{router.url}/v1/completions", json=body)
    await held.content.readuntil(b"\n\n")
    refused = await http.post(f"{router.url}/v1/completions", json=body)
    assert refused.status == 429
    assert int(refused.headers["Retry-After"]) >= 1
    assert (await refused.json())["error"]["code"] == "overloaded"
    engine.release.set()
    assert (await held.read()).rstrip().endswith(b"[DONE]")
    again = await http.post(f"{router.url}/v1/completions", json={"model": "m", "prompt": "p"})
    assert again.status == 200
    metrics = await (await http.get(f"{router.url}/metrics")).text()
    assert 'hiveroute_rejected_requests_total{reason="overloaded"} 1.0' in metrics
