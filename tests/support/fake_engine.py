"""A programmable stand-in for an engine, for tests that must see exact bytes and disconnects.

The simulator (hiveroute.sim) is the realistic engine; this one records what it received and
lets a test hold a stream at a given chunk, fail, or stall, deterministically.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict


@dataclass
class FakeEngineBehaviour:
    models: list[str] = field(default_factory=lambda: ["m"])
    status: int = 200
    error_body: dict[str, Any] | None = None
    stall_before_response_s: float = 0.0
    stream_chunks: int = 3
    hold_after_chunk: int | None = None  # stream pauses after this chunk until `release` is set
    die_after_chunk: int | None = None  # stream connection is cut after this chunk
    healthy: bool = True
    health_stall_s: float = 0.0  # /health answers this late (an overloaded engine)
    running: int = 0
    waiting: int = 0
    usage_for: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # request -> usage


class FakeEngine:
    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.behaviour = FakeEngineBehaviour()
        self.received: list[dict[str, Any]] = []
        self.received_raw: list[bytes] = []
        self.received_headers: list[CIMultiDict[str]] = []
        self.release = asyncio.Event()
        self.stream_closed_by_client = asyncio.Event()
        self.chunks_sent = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port or self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "owned_by": "fake"} for m in self.behaviour.models]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        if self.behaviour.health_stall_s:
            await asyncio.sleep(self.behaviour.health_stall_s)
        return web.Response(status=200 if self.behaviour.healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        b = self.behaviour
        text = (
            f'vllm:num_requests_running{{model_name="m"}} {b.running}\n'
            f'vllm:num_requests_waiting{{model_name="m"}} {b.waiting}\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
        )
        return web.Response(text=text)

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.received_raw.append(raw)
        self.received.append(json.loads(raw))
        self.received_headers.append(CIMultiDict(request.headers))
        b = self.behaviour
        if b.stall_before_response_s:
            await asyncio.sleep(b.stall_before_response_s)
        if b.status >= 400:
            return web.json_response(
                b.error_body or {"error": {"message": "nope"}}, status=b.status
            )
        body = self.received[-1]
        usage = {
            "prompt_tokens": 10,
            "completion_tokens": b.stream_chunks,
            "total_tokens": 10 + b.stream_chunks,
            "prompt_tokens_details": {"cached_tokens": 4},
        }
        if b.usage_for is not None:
            usage = b.usage_for(body)
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "model": body.get("model"),
                    "choices": [
                        {"index": 0, "text": "x" * b.stream_chunks, "finish_reason": "length"}
                    ],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for i in range(b.stream_chunks):
                chunk = {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "model": body.get("model"),
                    "choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}],
                }
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.chunks_sent += 1
                if b.hold_after_chunk == i:
                    await self.release.wait()
                if b.die_after_chunk == i:
                    assert request.transport is not None
                    request.transport.close()
                    return response
            final = {"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": usage}
            await response.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        except (asyncio.CancelledError, ConnectionResetError):
            self.stream_closed_by_client.set()
            raise
        return response
