"""Fakes for the harness: a unit context that records what a workload sends and never sleeps,
and an engine with known timings."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hiveroute.bench.workloads.base import BenchRequest, Reply, Unit
from tests.support.fake_engine import FakeEngine, requested_tokens


class RecordingContext:
    """Its clock moves only by `sleep` and by `latency_s` per request sent."""

    def __init__(self, answer: str = "done ", latency_s: float = 0.0) -> None:
        self.answer = answer
        self.latency_s = latency_s
        self.clock = 0.0
        self.sent: list[BenchRequest] = []
        self.sent_at: list[float] = []
        self.slept: list[float] = []
        self.controls: list[tuple[str, str, dict[str, Any] | None]] = []

    async def send(self, request: BenchRequest) -> Reply:
        self.sent.append(request)
        self.sent_at.append(self.clock)
        self.clock += self.latency_s
        await asyncio.sleep(0)
        return Reply(f"r{len(self.sent)}", self.answer, True)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock += seconds
        await asyncio.sleep(0)

    def now(self) -> float:
        return self.clock

    async def control(self, method: str, path: str, body: dict[str, Any] | None = None) -> None:
        self.controls.append((method, path, body))


async def run_units(units: list[Unit], latency_s: float = 0.0) -> list[RecordingContext]:
    contexts = []
    for unit in units:
        ctx = RecordingContext(latency_s=latency_s)
        await unit.run(ctx)
        contexts.append(ctx)
    return contexts


def timed_engine(ttft_s: float = 0.05, itl_s: float = 0.01, cached_tokens: int = 7) -> FakeEngine:
    """A fake engine that streams like vLLM with known delays, one chunk per max_tokens, and
    reports a prompt token per word and a fixed cached count, for measuring the driver."""
    engine = FakeEngine("timed")
    b = engine.behaviour
    b.models, b.stream_chunks, b.chat_chunks = ["fake-model"], None, True
    b.ttft_s, b.itl_s = ttft_s, itl_s

    def usage(body: dict[str, Any]) -> dict[str, Any]:
        chat = "messages" in body
        prompt = json.dumps(body.get("messages")) if chat else str(body.get("prompt"))
        prompt_tokens = len(prompt.split())
        n = requested_tokens(body)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        }

    b.usage_for = usage
    return engine
