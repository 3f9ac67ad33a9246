"""A fake unit context: records what a workload sends, answers with fixed text, never sleeps."""

from __future__ import annotations

import asyncio

from hiveroute.bench.workloads.base import BenchRequest, Reply, Unit


class RecordingContext:
    def __init__(self, answer: str = "done ") -> None:
        self.answer = answer
        self.sent: list[BenchRequest] = []
        self.slept: list[float] = []

    async def send(self, request: BenchRequest) -> Reply:
        self.sent.append(request)
        await asyncio.sleep(0)
        return Reply(f"r{len(self.sent)}", self.answer, True)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.sleep(0)


async def run_units(units: list[Unit]) -> list[RecordingContext]:
    contexts = []
    for unit in units:
        ctx = RecordingContext()
        await unit.run(ctx)
        contexts.append(ctx)
    return contexts
