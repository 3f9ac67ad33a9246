"""The step ends that engines sharing one event loop are waiting for, so that work which can
wait gets out of their way.

Eight simulated engines share one event loop. When an engine's step is due, its outputs must
leave at once; if another engine is then in the middle of work that could as well have run a
moment earlier or later (giving a step's requests their tokens, taking in a new request, writing
stream chunks that are already being held back), the step ends late, by as long as that work
takes. So such work first asks the board for a gap: it runs now if no sleeping engine's step
ends before the work would be done, else once that step end has been served. Work whose own
deadline is at stake (`latest`) never waits past it. Each kind of work's duration is learned as
it runs (`WorkCost`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

GUARD = 0.0001  # seconds kept free before another engine's step end, beyond the work's cost
MAX_WAIT = 0.05  # longest work waits in all, seconds: an engine that never serves cannot hold it


@dataclass(slots=True)
class WorkCost:
    """A running estimate of how long one piece of some kind of work takes, seconds.

    It follows rises at once and falls slowly: underestimating a cost is what makes a step
    late, overestimating one only makes the work wait a little longer for its gap.
    """

    seconds: float
    decay: float = 0.95

    def observe(self, seconds: float) -> None:
        self.seconds = _follow(self.seconds, seconds, self.decay)


@dataclass(slots=True)
class SizedWorkCost:
    """Like `WorkCost`, for work whose duration grows with its size (bytes of a request).

    The rate follows rises at once and falls slowly; sizes under `floor` count as `floor`, which
    stands for the work's fixed part. One large request then does not make every small one
    look large (a single figure would, and they would wait for gaps they do not need).
    """

    seconds_per_unit: float
    floor: int = 2048
    decay: float = 0.95

    def seconds(self, units: int) -> float:
        return self.seconds_per_unit * max(units, self.floor)

    def observe(self, seconds: float, units: int) -> None:
        rate = seconds / max(units, self.floor)
        self.seconds_per_unit = _follow(self.seconds_per_unit, rate, self.decay)


def _follow(estimate: float, observed: float, decay: float) -> float:
    """An estimate that takes a rise at once and a fall slowly."""
    return observed if observed > estimate else decay * estimate + (1 - decay) * observed


@dataclass
class DeadlineBoard:
    """The sleeping engines' step ends, and the work waiting for them to pass."""

    _due: dict[int, float] = field(default_factory=dict)
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)
    waits: int = 0  # times work waited for a step end (reported by the step-lag benchmark)

    def sleeping_until(self, owner: int, deadline: float) -> None:
        """Engine `owner` sleeps until its step ends at `deadline` (time.monotonic seconds)."""
        self._due[owner] = deadline

    def served(self, owner: int) -> None:
        """Engine `owner` has handed out its step's outputs: work waiting for it may go on."""
        if self._due.pop(owner, None) is None:
            return
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def next_due(self, exclude: int | None = None) -> float | None:
        """The earliest step end among sleeping engines other than `exclude`."""
        dues = [d for owner, d in self._due.items() if owner != exclude]
        return min(dues) if dues else None

    async def gap(
        self, need: float, *, owner: int | None = None, latest: float | None = None
    ) -> None:
        """Return when `need` seconds of work can run without holding up another step end.

        `latest` is when the work must start for its own deadline: it never waits past that.
        """
        clock = time.monotonic
        give_up = clock() + MAX_WAIT
        latest = give_up if latest is None else min(latest, give_up)
        while True:
            due = self.next_due(owner)
            if due is None:
                return
            now = clock()
            if due - now > need + GUARD or now >= latest:
                return
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            timeout = loop.call_later(latest - now, _resolve, waiter)
            self.waits += 1
            try:
                await waiter
            finally:
                timeout.cancel()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
