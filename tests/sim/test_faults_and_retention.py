"""Fault knobs (CLI, runtime endpoint, Python) and the retention hint."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from hiveroute.sim.faults import FaultKnobs
from tests.sim.conftest import FleetFactory

PROMPT = list(range(100, 140))


async def test_fail_fraction_from_config_and_runtime(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(faults=FaultKnobs(fail_fraction=1.0, fail_status=503))
    url = fleet.engines[0].url
    resp = await session.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert resp.status == 503 and "simulated" in (await resp.json())["error"]["message"]
    set_resp = await session.post(f"{url}/sim/faults", json={"fail_fraction": 0})
    assert (await set_resp.json())["fail_fraction"] == 0.0
    resp = await session.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert resp.status == 200
    bad = await session.post(f"{url}/sim/faults", json={"fail_fraction": 2})
    assert bad.status == 400
    bad = await session.post(f"{url}/sim/faults", json={"no_such_knob": 1})
    assert bad.status == 400 and "known" in (await bad.json())["error"]["message"]


async def test_fail_fraction_is_a_fraction(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    fleet.engines[0].faults.update({"fail_fraction": 0.5})  # from Python
    statuses = []
    for _ in range(40):
        resp = await session.post(
            f"{fleet.engines[0].url}/v1/completions", json={"prompt": "x", "max_tokens": 1}
        )
        statuses.append(resp.status)
    assert 5 < statuses.count(500) < 35 and statuses.count(200) == 40 - statuses.count(500)


async def test_stall_before_first_token(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    engine = fleet.engines[0]
    engine.faults.stall_first_token_s = 0.5
    task = asyncio.create_task(
        session.post(f"{engine.url}/v1/completions", json={"prompt": "x", "max_tokens": 1})
    )
    await asyncio.sleep(0.2)
    assert engine.steps == 0 and not task.done()  # nothing scheduled while stalled
    resp = await task
    assert resp.status == 200 and engine.steps >= 1


async def test_drop_connection_mid_stream(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    engine = fleet.engines[0]
    await session.post(
        f"{engine.url}/sim/faults", json={"drop_fraction": 1.0, "drop_after_tokens": 2}
    )
    body = {"prompt": "x", "max_tokens": 50, "stream": True}
    resp = await session.post(f"{engine.url}/v1/completions", json=body)
    with pytest.raises(aiohttp.ClientPayloadError):
        await resp.read()
    for _ in range(50):
        if not engine.scheduler.running:
            break
        await asyncio.sleep(0.02)
    assert not engine.scheduler.running and engine.pool.usage() == 0.0  # the request was aborted


async def test_retention_hint_pins_a_prefix_against_eviction(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(num_blocks=6)  # 5 usable blocks of 16
    url = fleet.engines[0].url
    await session.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
    pin = await (
        await session.post(f"{url}/sim/retain", json={"prompt_token_ids": PROMPT, "seconds": 60})
    ).json()
    assert pin == {"pinned_blocks": 2, "pinned_tokens": 32, "expires_in_s": 60.0}
    # Another prompt needs 3 blocks; only 3 are free while the pin holds 2: nothing pinned goes.
    other = list(range(500, 540))
    await session.post(f"{url}/v1/completions", json={"prompt": other, "max_tokens": 1})
    third = list(range(900, 940))
    await session.post(f"{url}/v1/completions", json={"prompt": third, "max_tokens": 1})
    again = await (
        await session.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
    ).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    released = await (
        await session.post(f"{url}/sim/retain", json={"prompt_token_ids": PROMPT, "seconds": 0})
    ).json()
    assert released["pinned_blocks"] == 0
    state = await (await session.get(f"{url}/sim/state")).json()
    assert state["pins"] == 0
    bad = await session.post(f"{url}/sim/retain", json={"seconds": 5})
    assert bad.status == 400


async def test_retention_expires(sim_fleet: FleetFactory, session: aiohttp.ClientSession) -> None:
    fleet = await sim_fleet()
    engine = fleet.engines[0]
    await session.post(f"{engine.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
    engine.retain(PROMPT, None, 0.2)
    assert engine.pool.usage() > 0
    deadline = time.monotonic() + 5
    while engine.pool.usage() > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert engine.pool.usage() == 0.0 and engine.state()["pins"] == 0
