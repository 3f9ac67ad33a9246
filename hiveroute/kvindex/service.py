"""Following the pool's KV events: one subscriber per engine that publishes them.

As a router component the service subscribes to every engine that has a KV-event endpoint
(``--engine URL,events=tcp://H:P[,replay=tcp://H:P]``), and follows the pool: it subscribes to
engines that join and forgets engines that leave. It also notices engines that serve requests
but whose events never come (kvindex/staleness.py; the pipeline tells it, through `served`,
which engine answered). The index it feeds is built by the assembly and shared with the routing
plugins; `KvIndexCollector` shows both on /metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from hiveroute.engines.engine import Engine
from hiveroute.engines.pool import EnginePool
from hiveroute.kvindex.index import KvIndex
from hiveroute.kvindex.staleness import EventStaleness
from hiveroute.kvindex.subscriber import KvEventSubscriber

log = logging.getLogger("hiveroute.kvindex")

CHECK_EVERY_S = 1.0


def build_kv_index(
    max_blocks: int | None = None, speculative_ttl_s: float | None = None
) -> KvIndex:
    """A KvIndex with the configured bounds (its own defaults where none is set)."""
    kwargs: dict[str, Any] = {}
    if max_blocks is not None:
        kwargs["max_blocks"] = max_blocks
    if speculative_ttl_s is not None:
        kwargs["speculative_ttl_s"] = speculative_ttl_s
    return KvIndex(**kwargs)


class KvEventService:
    """Keeps one KV-event subscriber per engine that publishes events, and notices engines
    that serve requests but whose events never come (see kvindex/staleness.py)."""

    def __init__(
        self,
        pool: EnginePool,
        index: KvIndex,
        *,
        topic: str = "",
        staleness: EventStaleness | None = None,
    ) -> None:
        self.pool = pool
        self.index = index
        self.topic = topic
        self.staleness = staleness or EventStaleness()
        self.subscribers: dict[str, KvEventSubscriber] = {}
        self._context: zmq.asyncio.Context | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self._checker: asyncio.Task[None] | None = None
        pool.on_added(self._on_added)
        pool.on_removed(self._on_removed)

    # --- router component --------------------------------------------------------------------

    async def start(self) -> None:
        self._context = zmq.asyncio.Context()
        for engine in self.pool.engines:
            self._subscribe(engine)
        self._checker = asyncio.get_running_loop().create_task(
            self._check_loop(), name="kv-events-staleness"
        )

    async def stop(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            await asyncio.gather(self._checker, return_exceptions=True)
            self._checker = None
        subscribers = list(self.subscribers.values())
        self.subscribers.clear()
        for subscriber in subscribers:
            await subscriber.stop()
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
        if self._context is not None:
            # every socket is closed by now; destroy, not term, so one left open (a bug) cannot
            # block the event loop for good on shutdown
            self._context.destroy(linger=0)
            self._context = None

    # --- staleness ----------------------------------------------------------------------------

    def served(self, engine: str) -> None:
        """`engine` answered a request: it owes KV events (the pipeline calls this)."""
        self.staleness.served(engine)

    def check_staleness(self) -> list[str]:
        """Engines newly stale (each logged once); run every second and at each scrape."""
        return self.staleness.check({n: s.stats.batches for n, s in self.subscribers.items()})

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            self.check_staleness()

    # --- following the pool ------------------------------------------------------------------

    def _subscribe(self, engine: Engine) -> None:
        if self._context is None or engine.spec.events is None:
            return
        subscriber = KvEventSubscriber(
            engine.name,
            engine.spec.events,
            self.index,
            replay_endpoint=engine.spec.replay,
            topic=self.topic,
            context=self._context,
        )
        self.subscribers[engine.name] = subscriber
        self.staleness.track(engine.name, engine.spec.events)
        subscriber.start()
        log.info("subscribed to KV events of %s at %s", engine.name, engine.spec.events)

    def _unsubscribe(self, name: str) -> None:
        subscriber = self.subscribers.pop(name, None)
        self.staleness.forget(name)
        if subscriber is not None:
            subscriber.detach()  # at once: the caller clears the engine's entries next
            task = asyncio.get_running_loop().create_task(subscriber.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    def _on_added(self, engine: Engine) -> None:
        if self._context is None:
            return  # not started: start() subscribes to every engine then
        self._unsubscribe(engine.name)  # a changed spec replaces the engine under its name
        self.index.clear_engine(engine.name)
        self._subscribe(engine)

    def _on_removed(self, engine: Engine) -> None:
        if self._context is not None:
            self._unsubscribe(engine.name)  # first: its subscriber must not write after this
        self.index.remove_engine(engine.name)


class KvIndexCollector:
    """Prometheus view of the index and the subscribers, read at scrape time."""

    def __init__(self, service: KvEventService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        self.service.check_staleness()
        staleness = self.service.staleness
        index = self.service.index
        yield GaugeMetricFamily(
            "hiveroute_kv_index_blocks", "Block keys in the KV index", value=len(index)
        )
        yield CounterMetricFamily(
            "hiveroute_kv_index_evictions",
            "Block keys the KV index forgot to stay under its cap (LRU)",
            value=index.evictions,
        )
        per_engine = GaugeMetricFamily(
            "hiveroute_kv_index_engine_blocks",
            "Blocks the KV index believes each engine holds",
            labels=["engine"],
        )
        for name in index.engines():
            per_engine.add_metric([name], index.engine_block_count(name))
        yield per_engine
        events = CounterMetricFamily(
            "hiveroute_kv_events", "KV events applied, by engine", labels=["engine"]
        )
        gaps = CounterMetricFamily(
            "hiveroute_kv_event_gaps",
            "Gaps in an engine's KV-event sequence, by how they were resolved",
            labels=["engine", "outcome"],
        )
        restarts = CounterMetricFamily(
            "hiveroute_kv_publisher_restarts",
            "Times an engine's KV-event sequence restarted (the engine restarted)",
            labels=["engine"],
        )
        errors = CounterMetricFamily(
            "hiveroute_kv_event_decode_errors",
            "KV-event messages that could not be decoded",
            labels=["engine"],
        )
        lag = GaugeMetricFamily(
            "hiveroute_kv_event_lag_seconds",
            "Seconds from an engine stamping its latest KV-event batch to the router applying it",
            labels=["engine"],
        )
        stale = GaugeMetricFamily(
            "hiveroute_kv_events_stale",
            "1 while an engine that served requests has sent no KV events for "
            f"{staleness.stale_after_s:.0f} s (a wrong events= address?)",
            labels=["engine"],
        )
        age = GaugeMetricFamily(
            "hiveroute_kv_event_age_seconds",
            "Seconds since an engine's latest KV-event batch (since subscribing, if none came)",
            labels=["engine"],
        )
        for name, sub in self.service.subscribers.items():
            stale.add_metric([name], 1.0 if staleness.is_stale(name) else 0.0)
            seconds = staleness.seconds_since_event(name)
            if seconds is not None:
                age.add_metric([name], seconds)
            stats = sub.stats
            if stats.lag_s is not None:
                lag.add_metric([name], stats.lag_s)
            events.add_metric([name], stats.events)
            gaps.add_metric([name, "replayed"], stats.gaps_replayed)
            gaps.add_metric([name, "dropped"], stats.gaps_dropped)
            restarts.add_metric([name], stats.publisher_restarts)
            errors.add_metric([name], stats.decode_errors)
        yield from (events, gaps, restarts, errors, lag, stale, age)
