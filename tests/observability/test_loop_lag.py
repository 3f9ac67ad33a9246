"""The event-loop lag probe notes the wait a blocked loop makes a request meet."""

from __future__ import annotations

import asyncio
import time

from hiveroute.observability.loop_lag import LoopLagProbe
from hiveroute.observability.metrics import RouterMetrics


def _late_samples(metrics: RouterMetrics, over_s: float) -> float:
    """Samples later than `over_s` (a bucket bound)."""
    registry = metrics.registry
    name = "hiveroute_event_loop_lag_seconds"
    count = registry.get_sample_value(f"{name}_count") or 0.0
    within = registry.get_sample_value(f"{name}_bucket", {"le": str(over_s)}) or 0.0
    return count - within


async def test_a_loop_held_by_work_is_seen_late() -> None:
    metrics = RouterMetrics()
    probe = LoopLagProbe(metrics.loop_lag, interval_s=0.01)
    await probe.start()
    try:
        await asyncio.sleep(0.02)  # the probe's timer is set
        time.sleep(0.12)  # work that does not yield: a request arriving now waits for it
        for _ in range(100):  # the timer runs once the loop is free
            await asyncio.sleep(0.01)
            if _late_samples(metrics, 0.1):
                break
        assert _late_samples(metrics, 0.1) >= 1  # it woke at least 0.1 s late
    finally:
        await probe.stop()
    assert probe._task is None


async def test_the_router_exports_the_lag_from_the_start() -> None:
    """One series with no label: in /metrics (and merged over workers) before any sample."""
    metrics = RouterMetrics()
    assert metrics.registry.get_sample_value("hiveroute_event_loop_lag_seconds_count") == 0.0
