"""State stores for tests that stand for one across a network (Redis, the workers' shared
store): one whose round trips can be counted, one that answers nothing until released."""

from __future__ import annotations

import asyncio
from typing import Any

from hiveroute.state.memory import MemoryStateStore

# the StateStore calls the router makes on a request's way
REMOTE_METHODS = ("get", "set", "delete", "expire", "hget", "hgetall", "hset", "hdel", "hincrby",
                  "hincrby_many", "hincrbyfloat", "push_bounded", "lrange", "set_if_absent")  # fmt: skip


def _wrap_calls(store: MemoryStateStore, wrap: Any) -> None:
    """Replace each of `store`'s REMOTE_METHODS by `wrap(method)`."""
    for name in REMOTE_METHODS:
        setattr(store, name, wrap(getattr(store, name)))


class RoundCountingStore(MemoryStateStore):
    """A store across a network: calls issued together travel in one round trip. Every call
    waits for the next round; a round leaves once no new call joined it for a few loop turns.
    `rounds_allowed`: rounds past that many wait until `release` is set (what a request's
    path does not wait for is left waiting)."""

    in_process = False

    def __init__(self, rounds_allowed: int | None = None) -> None:
        super().__init__()
        self.rounds = 0
        self.rounds_allowed = rounds_allowed
        self.release = asyncio.Event()
        self._waiting: list[asyncio.Future[None]] = []
        # in a call: the calls it makes itself (set_if_absent's set) are local, not a round
        self._serving = False
        _wrap_calls(self, self._remote)

    def _remote(self, call):  # type: ignore[no-untyped-def]
        async def remote(*args, **kwargs):  # type: ignore[no-untyped-def]
            if self._serving:
                return await call(*args, **kwargs)
            future = asyncio.get_running_loop().create_future()
            self._waiting.append(future)
            if len(self._waiting) == 1:
                asyncio.get_running_loop().create_task(self._send_round())
            await future
            self._serving = True  # the memory store's calls never suspend
            try:
                return await call(*args, **kwargs)
            finally:
                self._serving = False

        return remote

    async def _send_round(self) -> None:
        for _ in range(5):  # calls gathered together all join within a few turns
            await asyncio.sleep(0)
        if self.rounds_allowed is not None and self.rounds >= self.rounds_allowed:
            await self.release.wait()
        self.rounds += 1
        waiting, self._waiting = self._waiting, []
        for future in waiting:
            future.set_result(None)


class StalledStore(MemoryStateStore):
    """A remote store (every call suspends) that answers nothing until `release` is set."""

    in_process = False

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.release.set()
        _wrap_calls(self, self._stalled)

    def _stalled(self, call):  # type: ignore[no-untyped-def]
        async def stalled(*args, **kwargs):  # type: ignore[no-untyped-def]
            await self.release.wait()
            return await call(*args, **kwargs)

        return stalled
