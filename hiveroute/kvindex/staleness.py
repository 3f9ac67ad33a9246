"""Engines that serve requests but send no KV events: a wrong `events=` address, a firewall.

A SUB socket connects to any address and then waits quietly, so a mistyped endpoint looks
exactly like an idle engine. What tells them apart is traffic: an engine that served requests
stores blocks, and storing blocks publishes events. When the first request an engine served
since its last event (or since the router subscribed) is `stale_after_s` old and still no event
came, the engine's events are stale: logged once per episode, shown on /dashboard and as
`hiveroute_kv_events_stale{engine}`. An event clears it.

(Traffic whose every prompt and output is already cached stores nothing; such an engine can
look stale until a request brings a new block.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger("hiveroute.kvindex.events")

STALE_AFTER_S = 10.0


@dataclass
class _EngineWatch:
    endpoint: str
    subscribed_at: float
    batches: int = 0
    last_event_at: float | None = None
    waiting_since: float | None = None  # first request served since the last event
    stale: bool = False


class EventStaleness:
    """Per engine: when it last sent a KV-event batch, and whether it is overdue."""

    def __init__(
        self,
        stale_after_s: float = STALE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stale_after_s = stale_after_s
        self.clock = clock
        self._engines: dict[str, _EngineWatch] = {}

    def track(self, engine: str, endpoint: str) -> None:
        """A (new) subscription: nothing is owed yet."""
        self._engines[engine] = _EngineWatch(endpoint, self.clock())

    def forget(self, engine: str) -> None:
        self._engines.pop(engine, None)

    def served(self, engine: str) -> None:
        """The engine finished a request: events should follow."""
        watch = self._engines.get(engine)
        if watch is not None and watch.waiting_since is None:
            watch.waiting_since = self.clock()

    def check(self, batches: Mapping[str, int]) -> list[str]:
        """Update from each engine's count of applied batches; the engines newly stale."""
        now = self.clock()
        newly: list[str] = []
        for engine, watch in self._engines.items():
            count = batches.get(engine, watch.batches)
            if count != watch.batches:
                watch.batches = count
                watch.last_event_at = now
                watch.waiting_since = None
                if watch.stale:
                    watch.stale = False
                    log.info("KV events from %s arrive again", engine)
            elif (
                not watch.stale
                and watch.waiting_since is not None
                and now - watch.waiting_since >= self.stale_after_s
            ):
                watch.stale = True
                newly.append(engine)
                log.warning(
                    "engine %s served requests but sent no KV events in %.0f s; is %s its "
                    "publisher (vLLM's --kv-events-config endpoint)? KV-aware routing cannot see "
                    "its cache until events arrive",
                    engine,
                    now - watch.waiting_since,
                    watch.endpoint,
                )
        return newly

    def is_stale(self, engine: str) -> bool:
        watch = self._engines.get(engine)
        return watch is not None and watch.stale

    def seconds_since_event(self, engine: str) -> float | None:
        """Since the last batch (since subscribing if none came); None: not subscribed."""
        watch = self._engines.get(engine)
        if watch is None:
            return None
        since = watch.last_event_at if watch.last_event_at is not None else watch.subscribed_at
        return max(0.0, self.clock() - since)

    def received_any(self, engine: str) -> bool:
        watch = self._engines.get(engine)
        return watch is not None and watch.last_event_at is not None

    def engines(self) -> list[str]:
        return list(self._engines)
