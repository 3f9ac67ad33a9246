"""Admission control: a bounded number of requests in flight, a bounded queue, then 429.

Without a bound, a burst larger than the fleet can absorb grows the router's memory until it
falls over and takes every request with it. Requests beyond `max_in_flight` wait in FIFO
order for at most `timeout_s`; when `queue_depth` requests already wait, the next is refused at
once. Both refusals are 429 with Retry-After, which the OpenAI clients honour.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from hiveroute.errors import TooManyRequests


class AdmissionController:
    def __init__(self, max_in_flight: int, queue_depth: int, timeout_s: float) -> None:
        if max_in_flight <= 0:
            raise ValueError("max_in_flight must be positive")
        self.max_in_flight = max_in_flight
        self.queue_depth = queue_depth
        self.timeout_s = timeout_s
        self.in_flight = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        await self._acquire()
        try:
            yield
        finally:
            self._release()

    async def _acquire(self) -> None:
        if self.in_flight < self.max_in_flight and not self._waiters:
            self.in_flight += 1
            return
        if len(self._waiters) >= self.queue_depth:
            raise TooManyRequests(
                f"router is at capacity ({self.in_flight} in flight, {len(self._waiters)} queued); "
                "retry after the indicated delay",
                retry_after_s=max(1.0, self.timeout_s / 4),
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout=self.timeout_s)
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                return  # the slot arrived just as the timeout fired: keep it
            waiter.cancel()
            raise TooManyRequests(
                f"request waited {self.timeout_s:.1f}s for a slot and was not admitted; retry later",
                retry_after_s=max(1.0, self.timeout_s / 4),
            ) from None
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # we were handed a slot but the client left: pass it on
            else:
                waiter.cancel()
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _release(self) -> None:
        # Hand the slot straight to the oldest live waiter; the in-flight count stays the same.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_flight -= 1
