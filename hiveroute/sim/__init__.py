"""A vLLM-compatible engine simulator: paged KV cache, scheduler, cost model, KV events, API.

from hiveroute.sim import SimConfig, SimFleet
fleet = SimFleet(SimConfig(engines=2, base_port=0, events_base_port=0, preset="fast"))
await fleet.start(); ...; await fleet.stop()
"""

from hiveroute.sim.config import SimConfig
from hiveroute.sim.engine import SimEngine
from hiveroute.sim.faults import FaultKnobs
from hiveroute.sim.fleet import SimFleet
from hiveroute.sim.presets import PRESETS, CostModel, Preset

__all__ = ["PRESETS", "CostModel", "FaultKnobs", "Preset", "SimConfig", "SimEngine", "SimFleet"]
