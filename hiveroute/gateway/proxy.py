"""Relaying an engine's answer to the client (sending it is the EngineClient's job).

Streams are relayed chunk by chunk as they arrive (never buffered). A client that goes away
cancels the handler, which closes the upstream connection, which makes vLLM abort the request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import orjson
from aiohttp import web

from hiveroute.engines.client import UpstreamAnswer
from hiveroute.errors import UpstreamError
from hiveroute.gateway.apis import CHAT, Api
from hiveroute.gateway.usage import StreamTail, Usage, usage_from_json_bytes

# Headers passed from the client to the engine; everything else is the router's business.
FORWARD_REQUEST_HEADERS = (
    "authorization",
    "traceparent",
    "tracestate",
    "baggage",
    "anthropic-version",
    "anthropic-beta",
)
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


@dataclass
class RelayResult:
    status: int
    ttft_s: float | None = None
    usage: Usage | None = None
    error: str | None = None
    bytes_out: int = 0
    itl_s: float | None = None  # mean gap between streamed data events (see relay_stream)
    extra: dict[str, object] = field(default_factory=dict)
    body: bytes = b""  # a non-streamed answer's body (the adapter may read more than usage)


class RelayedStream(web.StreamResponse):
    """A relayed stream's response: its headers leave with its first chunk, in one write.

    The relay prepares the response when it holds the engine's first chunk already, so sending
    the headers on their own bought nothing: it cost a second send on the request's path to
    its first token, and woke the client (on a host the router shares, often handing it the
    core) before the token it waits for. aiohttp buffers the headers of its whole-body
    `Response` the same way; its streamed response has no public switch for it, and without
    this attribute the headers simply go first again."""

    _send_headers_immediately = False


def upstream_headers(
    incoming: web.BaseRequest, request_id: str, *, forward_authorization: bool = True
) -> dict[str, str]:
    """Headers for the engine from the client's. The client's key is not forwarded when the
    router checks keys; the engine's own key is added by the EngineClient."""
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    for name in FORWARD_REQUEST_HEADERS:
        if name == "authorization" and not forward_authorization:
            continue
        value = incoming.headers.get(name)
        if value is not None:
            headers[name] = value
    headers["X-Request-Id"] = request_id
    return headers


def response_headers(upstream: aiohttp.ClientResponse, extra: dict[str, str]) -> dict[str, str]:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in DROP_RESPONSE_HEADERS}
    headers.update(extra)
    return headers


async def relay_whole(
    answer: UpstreamAnswer, extra_headers: dict[str, str], started: float, api: Api = CHAT
) -> tuple[web.Response, RelayResult]:
    """Relay a non-streamed answer (an engine's own 4xx unchanged, or in the API's error
    shape when the engine answered in another)."""
    upstream = answer.response
    try:
        data = await upstream.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise UpstreamError(
            f"engine {answer.engine.name} failed before its answer was whole "
            f"({type(exc).__name__}); try again"
        ) from None
    finally:
        upstream.release()
    result = RelayResult(status=upstream.status, ttft_s=time.perf_counter() - started)
    if upstream.content_type == "application/json":
        if upstream.status < 400:
            result.usage = usage_from_json_bytes(data, api.usage)
            result.body = data
        elif api.engine_error is not None:
            data = api.engine_error(data)
    response = web.Response(
        body=data, status=upstream.status, headers=response_headers(upstream, extra_headers)
    )
    result.bytes_out = len(data)
    return response, result


async def relay_stream(
    request: web.Request,
    answer: UpstreamAnswer,
    extra_headers: dict[str, str],
    started: float,
    *,
    drop_usage: bool = False,
    api: Api = CHAT,
    first_token: Callable[[], None] | None = None,
) -> tuple[web.StreamResponse, RelayResult]:
    """Relay an SSE stream chunk by chunk. Engine failure mid-stream ends it with the API's
    error event; the usage is read from the stream's last events, as the API writes it.
    `first_token` is called when an API whose stream opens with events before its first token
    (`api.first_token`) sends that token: its prefill is over then.

    `drop_usage`: the router asked the engine for the usage chunk the client did not ask for;
    it is read (for the access log and counters) and not passed on."""
    upstream = answer.response
    out = RelayedStream(status=upstream.status, headers=response_headers(upstream, extra_headers))
    result = RelayResult(status=upstream.status)
    marker = api.first_token  # None: the first chunk is the first token
    if answer.first_chunk_at is not None and marker is None:
        result.ttft_s = answer.first_chunk_at - started
    tail = StreamTail()
    usage_filter = UsageChunkFilter() if drop_usage else None
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
            if marker is not None and result.ttft_s is None and marker in chunk:
                result.ttft_s = chunk_at - started
                if first_token is not None:
                    first_token()
            tail.feed(chunk)
            passed = chunk
            # inline fast path: whole events without usage pass as they came, no call, no copy
            # (a chunk that ends inside an event, even between its two newlines, goes through
            # the filter, which holds the rest until the event's end arrives)
            if usage_filter is not None and (
                usage_filter.held or b'"usage"' in chunk or not chunk.endswith(b"\n\n")
            ):
                passed = usage_filter.feed(chunk)
            if passed:
                await out.write(passed)
                result.bytes_out += len(passed)
            try:
                chunk = await upstream.content.readany()
                chunk_at = time.perf_counter()
            except (TimeoutError, aiohttp.ClientError) as exc:
                result.error = (
                    f"engine {answer.engine.name} failed mid-stream: {type(exc).__name__}"
                )
                rest = usage_filter.rest() if usage_filter is not None else b""
                await out.write(rest + api.stream_error(result.error))
                break
        rest = usage_filter.rest() if usage_filter is not None else b""
        if rest:  # an unterminated last event: passed on as it came
            await out.write(rest)
        await out.write_eof()
    finally:
        upstream.close()
    result.usage = tail.usage(api.usage)
    if events > 1 and result.error is None:
        result.itl_s = (last_event_at - first_event_at) / (events - 1)
    return out, result


class UsageChunkFilter:
    """Drops usage-only SSE events (`"choices": []` with a `usage` object) from a stream.

    Events are passed on as soon as they are complete; only an event split across chunks is held
    until its end arrives, so the stream stays chunk by chunk."""

    def __init__(self) -> None:
        self.held = b""  # the start of an event whose end has not arrived yet

    def feed(self, chunk: bytes) -> bytes:
        data = self.held + chunk if self.held else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self.held = data
            return b""
        complete, self.held = data[: end + 2], data[end + 2 :]
        if b'"usage"' not in complete:
            return complete
        events = complete.split(b"\n\n")
        return b"".join(e + b"\n\n" for e in events if e and not _usage_only(e))

    def rest(self) -> bytes:
        rest, self.held = self.held, b""
        return rest


def _usage_only(event: bytes) -> bool:
    if b'"usage"' not in event:
        return False
    line = event.strip()
    if not line.startswith(b"data:"):
        return False
    try:
        payload = orjson.loads(line[5:])
    except (ValueError, RecursionError):
        return False
    return (
        isinstance(payload, dict)
        and payload.get("choices") == []
        and isinstance(payload.get("usage"), dict)
    )
