"""Simulated engines inside `hiveroute serve` when no engine is configured."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from hiveroute.sim.config import SimConfig
from hiveroute.sim.fleet import SimFleet

log = logging.getLogger("hiveroute.sim")


async def start_embedded_engines(n: int, **overrides: Any) -> tuple[SimFleet, list[str]]:
    """Start `n` engines on 8100.. (events 5557..), or on free ports if those are taken.

    Returns the fleet (stop it with `await fleet.stop()`) and its `--engine` spec texts.
    """
    config = SimConfig(engines=n, **overrides)
    fleet = SimFleet(config)
    try:
        await fleet.start()
    except OSError as exc:
        log.warning("default simulator ports are taken (%s); using free ports", exc)
        config = dataclasses.replace(config, base_port=0, events_base_port=0, replay_base_port=None)
        fleet = SimFleet(config)
        await fleet.start()
    return fleet, fleet.engine_spec_texts()
