"""Simulated fleets on free loopback ports, and a ZMQ subscriber that decodes KV events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from hiveroute.sim import SimConfig, SimFleet

FleetFactory = Callable[..., Awaitable[SimFleet]]


def urls(fleet: SimFleet) -> list[str]:
    """The engines' plain URLs: a router that subscribes to no KV events (tests that start
    and stop many routers quickly; routing then learns from its own decisions)."""
    return [engine.url for engine in fleet.engines]


@pytest.fixture
async def sim_fleet() -> AsyncIterator[FleetFactory]:
    fleets: list[SimFleet] = []

    async def make(**overrides: Any) -> SimFleet:
        options: dict[str, Any] = {
            "engines": 1,
            "base_port": 0,
            "events_base_port": 0,
            "preset": "fast",
            "host": "127.0.0.1",
        }
        options.update(overrides)
        fleet = SimFleet(SimConfig(**options))
        await fleet.start()
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        await fleet.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s
