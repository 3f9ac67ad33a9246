"""How late the router's event loop runs: the wait a request meets before the router reads it.

A worker is one event loop: a request that arrives while it tokenizes another prompt, applies a
batch of KV events or relays tokens waits until that work yields. The router's own overhead
histogram (`hiveroute_router_overhead_seconds`) starts when the handler runs, so it misses this
wait. A timer that asks to wake every `interval_s` and notes how late it woke samples it: when
its p99 nears the TTFT budget, the router needs more workers or cores, not another policy.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

from hiveroute.lifecycle import cancel_and_wait

INTERVAL_S = 0.25  # four samples a second per worker: a cost no profile shows


class LoopLagProbe:
    """A router Component: samples its event loop's lateness into `histogram`."""

    def __init__(self, histogram: Histogram, *, interval_s: float = INTERVAL_S) -> None:
        self.histogram = histogram
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.histogram.observe(max(0.0, loop.time() - due))
