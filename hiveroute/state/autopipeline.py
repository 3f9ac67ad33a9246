"""Automatic pipelining: Redis commands that queue up while one is in flight travel together.

Each request's workflow bookkeeping is a few dozen small commands, and concurrent requests issue
them at the same time. Sent one by one, every command costs a write, a read and a parse (about
70-150 us of the router's CPU with redis-py); queued and sent as one pipeline they cost a
fraction of that. Batches are sent by one task of the pipeline's own, never by a caller: a
command issued while nothing is in flight goes out on the loop's next turn (with whatever else
was issued in this one); commands issued while a batch is in flight wait for it and then go out
together. A caller that gives up (its client went away, its handler was cancelled) only stops
waiting: the batch it was in still completes for the others (sent from a caller's own task, its
cancellation cut the batch short, and every other caller heard a Redis timeout: the replica
switched to local state). Order is kept: a caller awaits each command before it issues the
next, and batches go out in the order they filled.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

MAX_BATCH = 512  # commands per pipeline

Adder = Callable[[Any], Any]  # queues commands on a pipeline
Entry = tuple[Adder, int, "asyncio.Future[Any]"]


class AutoPipeline:
    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self._pending: deque[Entry] = deque()
        self._sender: asyncio.Task[None] | None = None  # sends while commands are queued

    async def run(self, add: Adder, n: int = 1) -> Any:
        """Queue the `n` commands `add` puts on a pipeline; their reply (n == 1) or replies."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((add, n, future))
        if self._sender is None:
            self._sender = loop.create_task(self._send_queued())
        return await future

    def _take(self) -> list[Entry]:
        batch: list[Entry] = []
        count = 0
        while self._pending and count < MAX_BATCH:
            entry = self._pending.popleft()
            batch.append(entry)
            count += entry[1]
        return batch

    async def _send_queued(self) -> None:
        try:
            while self._pending:
                await self._send(self._take())
        finally:
            self._sender = None

    async def _send(self, batch: list[Entry]) -> None:
        live = [entry for entry in batch if not entry[2].done()]  # callers that gave up
        if not live:
            return
        pipe = self.redis.pipeline(transaction=False)
        for add, _, _ in live:
            add(pipe)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except Exception as exc:  # the connection failed (or timed out): every caller hears it
            for _, _, future in live:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:  # the pipeline closes: nobody will answer its callers
            for _, _, future in live:
                future.cancel()
            raise
        at = 0
        for _, n, future in live:
            mine = replies[at : at + n]
            at += n
            if future.done():
                continue
            error = next((r for r in mine if isinstance(r, Exception)), None)
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(mine[0] if n == 1 else mine)

    def fail_pending(self, exc: Exception) -> None:
        """Fail every command not yet sent (Redis is down: their callers go local at once)."""
        while self._pending:
            future = self._pending.popleft()[2]
            if not future.done():
                future.set_exception(exc)

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        for _, _, future in self._pending:
            if not future.done():
                future.cancel()
        self._pending.clear()
