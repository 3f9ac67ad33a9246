"""Automatic pipelining: a caller that gives up does not cut the batch short for the others."""

from __future__ import annotations

import asyncio
from typing import Any

from hiveroute.state.autopipeline import AutoPipeline


class SlowRedis:
    """A Redis whose pipelines answer each command with its name, once `go` is set."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.batches: list[list[str]] = []

    def pipeline(self, transaction: bool = False) -> Any:
        redis = self

        class Pipe:
            def __init__(self) -> None:
                self.commands: list[str] = []

            async def execute(self, raise_on_error: bool = False) -> list[str]:
                redis.batches.append(self.commands)
                await redis.go.wait()
                return [f"reply to {c}" for c in self.commands]

        return Pipe()


async def test_a_caller_cancelled_mid_batch_leaves_the_others_their_replies() -> None:
    """Two handlers' commands travel in one batch; the first handler's client goes away while
    the batch is in flight. The second still gets its reply: when the first caller's own task
    sent the batch, its cancellation failed every command in it as a Redis timeout, and the
    replica took Redis for down."""
    redis = SlowRedis()
    pipeline = AutoPipeline(redis)
    first = asyncio.create_task(pipeline.run(lambda pipe: pipe.commands.append("GET a")))
    second = asyncio.create_task(pipeline.run(lambda pipe: pipe.commands.append("GET b")))
    while not redis.batches:
        await asyncio.sleep(0)
    assert redis.batches == [["GET a", "GET b"]]  # one batch, in flight
    first.cancel()
    await asyncio.sleep(0)
    redis.go.set()
    assert await second == "reply to GET b"
    assert first.cancelled()
    third = await pipeline.run(lambda pipe: pipe.commands.append("GET c"))
    assert third == "reply to GET c" and redis.batches[-1] == ["GET c"]
    await pipeline.close()
