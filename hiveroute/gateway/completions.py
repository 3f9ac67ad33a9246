"""The handler behind /v1/completions and /v1/chat/completions: HTTP only.

It reads and checks the body, pulls out the request's metadata and hands the pipeline a
parsed RoutingRequest; everything after (hooks, routing, retries, relay, and finishing the
request however it ends) is the RequestPipeline's (gateway/pipeline.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from hiveroute.gateway.apis import CHAT, COMPLETIONS
from hiveroute.gateway.auth import principal_of
from hiveroute.gateway.body import check_openai_fields, parse_json_object, read_body
from hiveroute.gateway.parts import GATEWAY_KEY, GatewayParts
from hiveroute.gateway.pipeline import Inbound
from hiveroute.gateway.request_ids import request_id_of
from hiveroute.metadata import extract_metadata
from hiveroute.routing.base import RoutingRequest

ParseWith = Callable[[GatewayParts, web.Request, str], Awaitable[Inbound]]


async def serve_with(request: web.Request, parse_with: ParseWith) -> web.StreamResponse:
    """Start the span and hand the pipeline the API's parser: what every API handler does."""
    parts = request.app[GATEWAY_KEY]
    span = None
    if parts.tracing is not None:
        span = parts.tracing.start_span(request.method, request.path, request.headers)
    request_id = request_id_of(request)

    async def parse() -> Inbound:
        return await parse_with(parts, request, request_id)

    return await parts.pipeline.serve(request, request_id, span, parse)


async def handle_completion(request: web.Request) -> web.StreamResponse:
    return await serve_with(request, parse_completion)


async def parse_completion(parts: GatewayParts, request: web.Request, request_id: str) -> Inbound:
    """Read, check and parse the body; the metadata comes out, the tenant's salt goes in."""
    raw = await read_body(request, parts.config.max_body_bytes)
    body = parse_json_object(raw)
    chat = request.path.endswith("/chat/completions")
    check_openai_fields(body, chat=chat)
    metadata, clean = extract_metadata(body, request.headers)
    tenant = principal_of(request).tenant
    if tenant is not None:  # tenants never share KV blocks (see gateway/auth.py)
        clean = {**clean, "cache_salt": parts.auth.cache_salt(tenant)}
    routed = RoutingRequest(
        request_id=request_id, path=request.path, body=clean, metadata=metadata, tenant=tenant
    )
    return Inbound(routed, raw if clean is body else None, api=CHAT if chat else COMPLETIONS)
