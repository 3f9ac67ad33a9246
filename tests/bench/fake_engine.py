"""A tiny OpenAI-compatible streaming server with known timings, for the driver's tests."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeEngine:
    ttft_s: float = 0.05
    itl_s: float = 0.01
    cached_tokens: int = 7
    fail_with: int | None = None  # answer every request with this HTTP status
    seen: list[dict[str, Any]] = field(default_factory=list)
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> FakeEngine:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text="vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
            "vllm:kv_cache_usage_perc 0.5\n"
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(body)
        self.seen_headers.append(dict(request.headers))
        if self.fail_with is not None:
            return web.json_response(
                {"error": {"message": "engine says no", "type": "x"}}, status=self.fail_with
            )
        chat = request.path.endswith("/chat/completions")
        prompt = json.dumps(body.get("messages")) if chat else str(body.get("prompt"))
        prompt_tokens = len(prompt.split())
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 4)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(obj: Any) -> None:
            await response.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        if chat:  # vLLM's first chat chunk carries the role and no content
            await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await asyncio.sleep(self.ttft_s)
        for i in range(n):
            if i:
                await asyncio.sleep(self.itl_s)
            piece = f"tok{i} "
            choice = (
                {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            )
            await send({"choices": [choice]})
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }
        await send({"choices": [], "usage": usage})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
