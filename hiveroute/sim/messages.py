"""The Anthropic Messages API of a simulated engine, in vLLM 0.32's shapes.

`POST /v1/messages` (streamed as `message_start`, `content_block_start`, `content_block_delta`,
`content_block_stop`, `message_delta`, `message_stop`; or not) and
`POST /v1/messages/count_tokens`. The prompt is `system` and `messages` rendered as chat, as
vLLM builds it (hiveroute.protocols.anthropic). Usage follows vLLM: `input_tokens` is the prompt
less the cached tokens, which are `cache_read_input_tokens` (reported, with
`cache_creation_input_tokens: 0`, when prompt-token details are on). Every error here is
Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from hiveroute.errors import BadRequest, HiverouteError
from hiveroute.gateway.body import parse_json_object, read_body
from hiveroute.protocols.anthropic import error_body
from hiveroute.protocols.common import expect_object, optional_int
from hiveroute.protocols.prompts import messages_prompt
from hiveroute.sim.engine import RequestHandle, SimEngine
from hiveroute.sim.intake import (
    ENGINE_KEY,
    MAX_BODY,
    Plan,
    admit,
    chat_sampling_fields,
    check_model,
    drop_connection,
    json_response,
    outputs,
    stream_cut,
)
from hiveroute.sim.requests import sampling_params

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def anthropic_errors(handler: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except HiverouteError as exc:
            return json_response(error_body(exc.status, exc.message), status=exc.status)

    return wrapped


def _stop_sequences(body: dict[str, Any]) -> list[str] | None:
    stop = body.get("stop_sequences")
    if stop is None:
        return None
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("'stop_sequences' must be a list of strings", param="stop_sequences")
    return stop


def stop_reason(handle: RequestHandle) -> tuple[str | None, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for how the request finished."""
    if handle.finish_reason == "length":
        return "max_tokens", None
    if handle.finish_reason != "stop":
        return None, None
    if isinstance(handle.stop_reason, str):
        return "stop_sequence", handle.stop_reason
    return "end_turn", None


def usage(handle: RequestHandle, details: bool) -> dict[str, Any]:
    cached = handle.cached_tokens if details else 0
    found: dict[str, Any] = {
        "input_tokens": max(0, handle.prompt_tokens - cached),
        "output_tokens": handle.completion_tokens,
    }
    if details:
        found["cache_creation_input_tokens"] = 0
        found["cache_read_input_tokens"] = cached
    return found


@anthropic_errors
async def create(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    raw = await read_body(request, MAX_BODY)
    asked: dict[str, Any] = {}

    def plan(body: dict[str, Any]) -> Plan:
        asked["model"] = check_model(engine, body)
        if body.get("max_tokens") is None:
            raise BadRequest("'max_tokens' is required", param="max_tokens")
        max_tokens = optional_int(body, "max_tokens", minimum=1)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("'stream' must be true or false", param="stream")
        if body.get("metadata") is not None:
            expect_object(body["metadata"], "metadata")
        tokens = messages_prompt(engine.tokenizer, body)
        params = sampling_params(
            chat_sampling_fields(max_tokens=max_tokens, stop=_stop_sequences(body), source=body),
            chat=True,
            num_prompt_tokens=len(tokens),
            max_model_len=engine.max_model_len,
            default_max_tokens=engine.config.default_max_tokens,
            priority_enabled=engine.config.scheduling_policy == "priority",
        )
        asked["stream"] = stream
        return Plan(tokens, params, stream)

    def failure(message: str, status: int) -> web.Response:
        return json_response(error_body(status, message), status=status)

    admitted = await admit(engine, raw, plan, failure)
    if isinstance(admitted, web.Response):
        return admitted
    del raw
    handle = admitted.handle
    message_id = f"chatcmpl-{uuid.uuid4().hex[:16]}"
    details = engine.config.enable_prompt_tokens_details
    try:
        if asked["stream"]:
            return await _stream(
                request, engine, handle, message_id, asked["model"], details, admitted.drop_after
            )
        text = "".join([out.text async for out in outputs(handle)])
        reason, sequence = stop_reason(handle)
        answer: dict[str, Any] = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "model": asked["model"],
            "stop_reason": reason,
        }
        if sequence is not None:
            answer["stop_sequence"] = sequence
        answer["usage"] = usage(handle, details)
        return json_response(answer)
    finally:
        engine.abort(handle)  # no-op when it finished; frees the blocks of a client that left


async def _event(resp: web.StreamResponse, kind: str, data: dict[str, Any]) -> None:
    text = json.dumps({"type": kind, **data}, separators=(",", ":"))
    await resp.write(f"event: {kind}\ndata: {text}\n\n".encode())


async def _stream(
    request: web.Request,
    engine: SimEngine,
    handle: RequestHandle,
    message_id: str,
    model: str,
    details: bool,
    drop_after: int | None,
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": handle.prompt_tokens, "output_tokens": 0},
    }
    await _event(resp, "message_start", {"message": start})
    await _event(
        resp, "content_block_start", {"content_block": {"type": "text", "text": ""}, "index": 0}
    )
    sent = 0
    async for out in outputs(handle):
        sent += len(out.token_ids)
        if out.text:
            delta = {"type": "text_delta", "text": out.text}
            await _event(resp, "content_block_delta", {"delta": delta, "index": 0})
        if out.finish_reason is None and drop_connection(engine, handle, request, sent, drop_after):
            return resp
    if stream_cut(handle, request):
        return resp
    await _event(resp, "content_block_stop", {"index": 0})
    reason, sequence = stop_reason(handle)
    await _event(
        resp,
        "message_delta",
        {
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(handle, details),
        },
    )
    await _event(resp, "message_stop", {})
    await resp.write_eof()
    return resp


@anthropic_errors
async def count_tokens(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = parse_json_object(await read_body(request, MAX_BODY))
    check_model(engine, body)
    count = len(messages_prompt(engine.tokenizer, body))
    return json_response(
        {"input_tokens": count, "context_management": {"original_input_tokens": count}}
    )


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", create)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
