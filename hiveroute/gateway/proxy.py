"""Sending a request to an engine and relaying the answer, with one retry elsewhere.

Streams are relayed chunk by chunk as they arrive (never buffered). A client that goes away
cancels the handler, which closes the upstream connection, which makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from hiveroute.engines.engine import Engine
from hiveroute.errors import error_body
from hiveroute.gateway.usage import StreamTail, Usage, usage_from_json_bytes

# Headers passed from the client to the engine; everything else is the router's business.
FORWARD_REQUEST_HEADERS = ("authorization", "traceparent", "tracestate", "baggage")
# Headers never copied from the engine's response (hop-by-hop or recomputed by aiohttp).
DROP_RESPONSE_HEADERS = {
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "date",
    "server",
    "content-encoding",
}
RETRY_STATUSES = {502, 503, 504}


class EngineUnreachable(Exception):
    """The engine could not be reached or sent nothing back: safe to try another engine.

    `slow`: it was reached but did not answer in time (overloaded or hung, not refused).
    """

    def __init__(self, message: str, *, slow: bool = False) -> None:
        super().__init__(message)
        self.slow = slow


@dataclass
class UpstreamAnswer:
    """An engine's response whose headers (and, for streams, first chunk) have arrived."""

    engine: Engine
    response: aiohttp.ClientResponse
    first_chunk: bytes = b""
    first_chunk_at: float | None = None

    @property
    def is_stream(self) -> bool:
        return self.response.content_type == "text/event-stream"


@dataclass
class RelayResult:
    status: int
    ttft_s: float | None = None
    usage: Usage | None = None
    error: str | None = None
    bytes_out: int = 0
    itl_s: float | None = None  # mean gap between streamed data events (see relay_stream)
    extra: dict[str, object] = field(default_factory=dict)


async def send_upstream(
    session: aiohttp.ClientSession,
    engine: Engine,
    path: str,
    payload: bytes,
    headers: dict[str, str],
    *,
    stream: bool,
    connect_timeout_s: float,
    first_byte_timeout_s: float,
    request_timeout_s: float,
) -> UpstreamAnswer:
    """POST to the engine; raise EngineUnreachable if it cannot be reached or stays silent."""
    timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=connect_timeout_s)
    try:
        response = await asyncio.wait_for(
            session.post(f"{engine.url}{path}", data=payload, headers=headers, timeout=timeout),
            timeout=first_byte_timeout_s if stream else request_timeout_s,
        )
    except TimeoutError:
        raise EngineUnreachable(f"no response from {engine.name} in time", slow=True) from None
    except aiohttp.ClientError as exc:
        raise EngineUnreachable(f"{engine.name}: {type(exc).__name__}: {exc}") from None
    if response.status in RETRY_STATUSES:
        detail = (await response.read())[:200].decode(errors="replace")
        response.release()
        raise EngineUnreachable(f"{engine.name} answered {response.status}: {detail}")
    answer = UpstreamAnswer(engine=engine, response=response)
    if answer.is_stream:
        try:
            answer.first_chunk = await asyncio.wait_for(
                response.content.readany(), timeout=first_byte_timeout_s
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            response.close()
            raise EngineUnreachable(
                f"{engine.name} sent no first byte ({type(exc).__name__})",
                slow=isinstance(exc, TimeoutError),
            ) from None
        if not answer.first_chunk:
            response.close()
            raise EngineUnreachable(f"{engine.name} closed the stream before its first byte")
        answer.first_chunk_at = time.perf_counter()
    return answer


def upstream_headers(
    incoming: web.BaseRequest,
    request_id: str,
    *,
    forward_authorization: bool = True,
    engine_api_key: str | None = None,
) -> dict[str, str]:
    """Headers for the engine. The client's key is not forwarded when the router checks keys."""
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    for name in FORWARD_REQUEST_HEADERS:
        if name == "authorization" and not forward_authorization:
            continue
        value = incoming.headers.get(name)
        if value is not None:
            headers[name] = value
    if engine_api_key:
        headers["authorization"] = f"Bearer {engine_api_key}"
    headers["X-Request-Id"] = request_id
    return headers


def response_headers(upstream: aiohttp.ClientResponse, extra: dict[str, str]) -> dict[str, str]:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in DROP_RESPONSE_HEADERS}
    headers.update(extra)
    return headers


async def relay_whole(
    answer: UpstreamAnswer, extra_headers: dict[str, str], started: float
) -> tuple[web.Response, RelayResult]:
    """Relay a non-streamed answer (including an engine's own 4xx, unchanged)."""
    upstream = answer.response
    try:
        data = await upstream.read()
    finally:
        upstream.release()
    result = RelayResult(status=upstream.status, ttft_s=time.perf_counter() - started)
    if upstream.status < 400 and upstream.content_type == "application/json":
        result.usage = usage_from_json_bytes(data)
    response = web.Response(
        body=data, status=upstream.status, headers=response_headers(upstream, extra_headers)
    )
    result.bytes_out = len(data)
    return response, result


def sse_error_event(message: str, code: str = "upstream_disconnected") -> bytes:
    """A well-formed SSE event carrying an OpenAI-style error (the openai client raises on it)."""
    payload = error_body(message, "upstream_error", code=code)
    return b"data: " + json.dumps(payload).encode() + b"\n\ndata: [DONE]\n\n"


async def relay_stream(
    request: web.Request,
    answer: UpstreamAnswer,
    extra_headers: dict[str, str],
    started: float,
) -> tuple[web.StreamResponse, RelayResult]:
    """Relay an SSE stream chunk by chunk. Engine failure mid-stream ends it with an error event."""
    upstream = answer.response
    out = web.StreamResponse(
        status=upstream.status, headers=response_headers(upstream, extra_headers)
    )
    result = RelayResult(status=upstream.status)
    if answer.first_chunk_at is not None:
        result.ttft_s = answer.first_chunk_at - started
    tail = StreamTail()
    # Inter-token latency, cheaply: count data events per chunk (a C-level byte count) and time
    # the first and the last chunk that carried one; the mean gap is their span over events - 1.
    events = 0
    first_event_at = last_event_at = 0.0
    try:
        await out.prepare(request)
        chunk = answer.first_chunk
        chunk_at = answer.first_chunk_at or time.perf_counter()
        while chunk:
            found = chunk.count(b"data:") - chunk.count(b"data: [DONE]")
            if found > 0:
                if not events:
                    first_event_at = chunk_at
                events += found
                last_event_at = chunk_at
            tail.feed(chunk)
            await out.write(chunk)
            result.bytes_out += len(chunk)
            try:
                chunk = await upstream.content.readany()
                chunk_at = time.perf_counter()
            except (TimeoutError, aiohttp.ClientError) as exc:
                result.error = (
                    f"engine {answer.engine.name} failed mid-stream: {type(exc).__name__}"
                )
                await out.write(sse_error_event(result.error))
                break
        await out.write_eof()
    finally:
        upstream.close()
    result.usage = tail.usage()
    if events > 1 and result.error is None:
        result.itl_s = (last_event_at - first_event_at) / (events - 1)
    return out, result
