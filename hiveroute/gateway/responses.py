"""The Responses API's handlers (`/v1/responses`, GET and cancel of an id): HTTP only.

Each reads and checks its request and hands the pipeline an Inbound with the Responses adapter
(gateway/apis.py: usage, error shape, the prompt as vLLM builds it). A stored response's id is
recorded with the engine that made it (gateway/response_ids.py); a request that names one
(`previous_response_id`, GET, cancel) is pinned to that engine and never retried elsewhere.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hiveroute.engines.engine import Engine
from hiveroute.errors import BadRequest
from hiveroute.gateway.apis import RESPONSES
from hiveroute.gateway.auth import principal_of
from hiveroute.gateway.body import parse_json_object, read_body
from hiveroute.gateway.completions import serve_with
from hiveroute.gateway.parts import GatewayParts
from hiveroute.gateway.pipeline import Inbound
from hiveroute.gateway.response_ids import ResponseIds, response_id_in
from hiveroute.metadata import RequestMetadata, extract_metadata
from hiveroute.protocols.responses import chat_tools, conversation_messages
from hiveroute.routing.base import RoutingRequest

BOOLEANS = ("stream", "store", "background")
STRINGS = ("model", "instructions", "previous_response_id")


def check_responses_fields(body: dict[str, Any]) -> None:
    """What the router relies on, and what vLLM would refuse in `input` and `tools` (a 400
    naming the field, in the Responses error shape)."""
    for name in STRINGS:
        if body.get(name) is not None and not isinstance(body[name], str):
            raise BadRequest(f"'{name}' must be a string", param=name)
    for name in BOOLEANS:
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise BadRequest(f"'{name}' must be true or false", param=name)
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("'metadata' must be an object of strings", param="metadata")
    conversation_messages(body)  # raises on a malformed `input` item
    chat_tools(body)


def recorder(ids: ResponseIds, tenant: str | None) -> Any:
    """What the pipeline tells of the answer: record the response's id with its engine."""

    async def seen(engine: Engine, head: bytes) -> None:
        found = response_id_in(head, whole=head.lstrip().startswith(b"{"))
        if found is not None:
            await ids.record(tenant, found, engine.name)

    return seen


async def parse_create(parts: GatewayParts, request: web.Request, request_id: str) -> Inbound:
    raw = await read_body(request, parts.config.max_body_bytes)
    body = parse_json_object(raw)
    check_responses_fields(body)
    metadata, clean = extract_metadata(body, request.headers)
    tenant = principal_of(request).tenant
    if tenant is not None:  # tenants never share KV blocks (see gateway/auth.py)
        clean = {**clean, "cache_salt": parts.auth.cache_salt(tenant)}
    pinned = None
    previous = body.get("previous_response_id")
    if previous:
        pinned = await parts.response_ids.home(tenant, previous, "previous_response_id")
    routed = RoutingRequest(
        request_id=request_id,
        path=request.path,
        body=clean,
        metadata=metadata,
        tenant=tenant,
        prompt=RESPONSES.prompt,
    )
    stored = body.get("store") is not False
    return Inbound(
        routed,
        raw if clean is body else None,
        api=RESPONSES,
        engine=pinned,
        on_answer=recorder(parts.response_ids, tenant) if stored else None,
    )


async def parse_by_id(parts: GatewayParts, request: web.Request, request_id: str) -> Inbound:
    """GET or cancel of a stored response: its engine, or the 4xx that says why not."""
    response_id = request.match_info["response_id"]
    tenant = principal_of(request).tenant
    pinned = await parts.response_ids.home(tenant, response_id, "response_id")
    cancel = request.path.endswith("/cancel")
    routed = RoutingRequest(
        request_id=request_id,
        path=request.path_qs,
        body={},
        metadata=RequestMetadata(),
        tenant=tenant,
    )
    return Inbound(
        routed,
        b"" if cancel else None,
        api=RESPONSES,
        engine=pinned,
        generation=False,
        method="POST" if cancel else "GET",
    )


async def handle_create(request: web.Request) -> web.StreamResponse:
    return await serve_with(request, parse_create)


async def handle_by_id(request: web.Request) -> web.StreamResponse:
    return await serve_with(request, parse_by_id)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses", handle_create)
    app.router.add_get("/v1/responses/{response_id}", handle_by_id)
    app.router.add_post("/v1/responses/{response_id}/cancel", handle_by_id)
