"""An engine as the router sees it: address, health, models and load."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hiveroute.config import EngineSpec
from hiveroute.engines.load_board import EngineCell


@dataclass
class EngineLoad:
    """Load as the router knows it: its own in-flight count plus what the engine reports."""

    in_flight: int = 0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    scraped_at: float = 0.0
    in_flight_at_scrape: int = 0

    @property
    def foreign(self) -> float:
        """Requests the engine reported that were not ours (other clients, other replicas)."""
        return max(0.0, self.running + self.waiting - self.in_flight_at_scrape)

    @property
    def queue_depth(self) -> float:
        """Requests the engine is busy with: ours now (always fresh) plus others' at last scrape."""
        return self.in_flight + self.foreign

    @property
    def router_in_flight(self) -> int:
        """Requests the whole router has in flight there (what `foreign` leaves out of a
        scrape): this process's, when it is the router."""
        return self.in_flight


class SharedEngineLoad(EngineLoad):
    """An engine's load in one worker of several (`serve --workers`): the worker's own count
    is published on the load board as it changes, and the router's requests in flight are
    every worker's. A subclass, so that a single router pays nothing for it."""

    def __init__(self, cell: EngineCell) -> None:
        self.cell = cell
        self._in_flight = 0
        super().__init__()

    @property
    def in_flight(self) -> int:
        """This worker's requests in flight there."""
        return self._in_flight

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        self._in_flight = value
        self.cell.publish_in_flight(value)

    @property
    def router_in_flight(self) -> int:
        return self.cell.router_in_flight()

    @property
    def queue_depth(self) -> float:
        return self.cell.router_in_flight() + self.foreign


@dataclass
class Engine:
    """One engine of the pool. Mutable state is owned by the EnginePool."""

    spec: EngineSpec
    healthy: bool = True
    models: set[str] = field(default_factory=set)
    load: EngineLoad = field(default_factory=EngineLoad)
    consecutive_failures: int = 0
    last_error: str | None = None
    down_since: float | None = None
    down_but_reachable: bool = False
    block_size: int | None = None
    kv_capacity_blocks: int | None = None  # the engine's KV cache, as its /metrics reports

    @property
    def name(self) -> str:
        return self.spec.name  # computed once per spec

    @property
    def url(self) -> str:
        return self.spec.url

    def status(self) -> dict[str, Any]:
        """The engine as /health and the dashboard show it (one place, so they agree)."""
        return {
            "name": self.name,
            "url": self.url,
            "healthy": self.healthy,
            "models": sorted(self.models),
            "in_flight": self.load.in_flight,
            "running": self.load.running,
            "waiting": self.load.waiting,
            "kv_usage": self.load.kv_usage,
            "last_error": self.last_error,
        }

    def serves(self, model: str | None) -> bool:
        """Whether this engine can take a request for `model` (unknown models list: assume yes)."""
        return model is None or not self.models or model in self.models

    def mark_down(self, reason: str, *, slow: bool = False) -> None:
        """Take the engine out. `slow`: it timed out but was reachable (overloaded, not dead)."""
        if self.healthy:
            self.down_since = time.monotonic()
        self.healthy = False
        self.last_error = reason
        self.down_but_reachable = slow

    def mark_up(self) -> None:
        self.healthy = True
        self.consecutive_failures = 0
        self.down_since = None
        self.last_error = None
        self.down_but_reachable = False
