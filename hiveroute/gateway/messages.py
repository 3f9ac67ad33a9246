"""The Anthropic Messages API's handlers (`/v1/messages`, `/v1/messages/count_tokens`): HTTP only.

Each reads and checks its request and hands the pipeline an Inbound with the Messages adapter
(gateway/apis.py: usage with Anthropic's cache fields, Anthropic's error shape, the prompt as
vLLM builds it). Messages requests are stateless: any engine serving the model can answer;
count_tokens generates nothing and goes to the least loaded one, without the policy.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hiveroute.errors import BadRequest
from hiveroute.gateway.apis import MESSAGES
from hiveroute.gateway.auth import principal_of
from hiveroute.gateway.body import parse_json_object, read_body
from hiveroute.gateway.completions import serve_with
from hiveroute.gateway.parts import GatewayParts
from hiveroute.gateway.pipeline import Inbound
from hiveroute.metadata import extract_metadata
from hiveroute.protocols.anthropic import chat_tools, conversation_messages
from hiveroute.routing.base import RoutingRequest


def check_messages_fields(body: dict[str, Any], *, create: bool) -> None:
    """What the router relies on, and what vLLM would refuse in `system`, `messages` and
    `tools` (a 400 naming the field, in Anthropic's error shape)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a string", param="model")
    if create:
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest("'max_tokens' is required: a positive integer", param="max_tokens")
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise BadRequest("'stream' must be true or false", param="stream")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("'metadata' must be an object", param="metadata")
    conversation_messages(body)  # raises on a malformed `system` or message
    chat_tools(body)


async def parse_messages(parts: GatewayParts, request: web.Request, request_id: str) -> Inbound:
    create = not request.path.endswith("/count_tokens")
    raw = await read_body(request, parts.config.max_body_bytes)
    body = parse_json_object(raw)
    check_messages_fields(body, create=create)
    metadata, clean = extract_metadata(body, request.headers)
    tenant = principal_of(request).tenant
    if tenant is not None and create:  # vLLM's Messages request takes `cache_salt` too
        clean = {**clean, "cache_salt": parts.auth.cache_salt(tenant)}
    routed = RoutingRequest(
        request_id=request_id,
        path=request.path,
        body=clean,
        metadata=metadata,
        tenant=tenant,
        prompt=MESSAGES.prompt,
    )
    return Inbound(routed, raw if clean is body else None, api=MESSAGES, generation=create)


async def handle_messages(request: web.Request) -> web.StreamResponse:
    return await serve_with(request, parse_messages)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", handle_messages)
    app.router.add_post("/v1/messages/count_tokens", handle_messages)
