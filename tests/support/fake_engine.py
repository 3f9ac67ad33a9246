"""A programmable stand-in for an engine, for tests that must see exact bytes, timings and
disconnects.

The simulator (hiveroute.sim) is the realistic engine; this one records what it received and
lets a test hold a stream at a given chunk, fail, stall, or answer with known delays,
deterministically.
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
    stream_chunks: int | None = 3  # None: as many as the request's max_tokens (default 4)
    ttft_s: float = 0.0  # delay before the first content chunk
    itl_s: float = 0.0  # delay between content chunks
    chat_chunks: bool = False  # chat streams as vLLM's: a role chunk first, then deltas
    hold_after_chunk: int | None = None  # stream pauses after this chunk until `release` is set
    die_after_chunk: int | None = None  # stream connection is cut after this chunk
    die_mid_body: bool = False  # a whole answer's connection is cut after part of its body
    healthy: bool = True
    health_stall_s: float = 0.0  # /health answers this late (an overloaded engine)
    running: int = 0
    waiting: int = 0
    usage_for: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # request -> usage
    # as vLLM's --api-key: every endpoint but /health answers 401 without this bearer key
    api_key: str | None = None
    # a Set-Cookie header on every answer not streamed (as a sticky-session proxy in front of
    # an engine sends)
    set_cookie: str | None = None
    # /v1/models answers this JSON as it is, instead of the list of `models` (a broken engine)
    models_body: Any = None


class FakeEngine:
    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.behaviour = FakeEngineBehaviour()
        self.received: list[dict[str, Any]] = []
        self.received_raw: list[bytes] = []
        self.received_headers: list[CIMultiDict[str]] = []
        self.calls: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        self.release = asyncio.Event()
        self.stream_closed_by_client = asyncio.Event()
        self.chunks_sent = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> FakeEngine:
        app = web.Application(middlewares=[self._check_key])
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
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _check_key(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        auth = request.headers.get("Authorization")
        self.calls.append((request.method, request.path, auth))
        key = self.behaviour.api_key
        if key is not None and request.path != "/health" and auth != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        if self.behaviour.set_cookie is not None and not response.prepared:
            response.headers["Set-Cookie"] = self.behaviour.set_cookie
        return response

    async def _models(self, request: web.Request) -> web.Response:
        if self.behaviour.models_body is not None:
            return web.json_response(self.behaviour.models_body)
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
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
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
        chunks = b.stream_chunks
        if chunks is None:
            chunks = requested_tokens(body)
        usage = {
            "prompt_tokens": 10,
            "completion_tokens": chunks,
            "total_tokens": 10 + chunks,
            "prompt_tokens_details": {"cached_tokens": 4},
        }
        if b.usage_for is not None:
            usage = b.usage_for(body)
        chat = b.chat_chunks and request.path.endswith("/chat/completions")
        if not body.get("stream"):
            if b.ttft_s or b.itl_s:
                await asyncio.sleep(b.ttft_s + max(0, chunks - 1) * b.itl_s)
            if b.die_mid_body:
                cut = web.StreamResponse(headers={"Content-Type": "application/json"})
                cut.content_length = 1000
                await cut.prepare(request)
                await cut.write(b'{"id": "cmpl-1", "choi')
                assert request.transport is not None
                request.transport.close()
                return cut
            return web.json_response(
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "model": body.get("model"),
                    "choices": [{"index": 0, "text": "x" * chunks, "finish_reason": "length"}],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            if chat:
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                await response.write(_event({"id": "cmpl-1", "choices": [role]}))
            if b.ttft_s:
                await asyncio.sleep(b.ttft_s)
            for i in range(chunks):
                if i and b.itl_s:
                    await asyncio.sleep(b.itl_s)
                choice: dict[str, Any] = {"index": 0, "text": f"t{i} ", "finish_reason": None}
                if chat:
                    choice = {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}
                chunk = {
                    "id": "cmpl-1",
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "model": body.get("model"),
                    "choices": [choice],
                }
                await response.write(_event(chunk))
                self.chunks_sent += 1
                if b.hold_after_chunk == i:
                    await self.release.wait()
                if b.die_after_chunk == i:
                    assert request.transport is not None
                    request.transport.close()
                    return response
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):  # as vLLM
                final = {"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": usage}
                await response.write(_event(final))
            await response.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            self.stream_closed_by_client.set()
            raise
        return response


def requested_tokens(body: dict[str, Any]) -> int:
    """The completion length a request asks for (4 when it does not say)."""
    return int(body.get("max_tokens") or body.get("max_completion_tokens") or 4)


def _event(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()
