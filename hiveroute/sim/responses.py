"""The OpenAI Responses API of a simulated engine, in vLLM 0.32's shapes.

`POST /v1/responses` (streamed as typed SSE events, or not; `background` runs it as a task),
`GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`. Responses live in this engine's
memory only, as with vLLM's `VLLM_ENABLE_RESPONSES_API_STORE=1`: a `previous_response_id` made
on another engine is a 404, as vLLM answers. The prompt is built as vLLM builds it
(hiveroute.protocols.responses), so a chain of responses hits the prefix cache like a chat.
Errors are OpenAI's shape with the status as `code`, as vLLM sends them.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from hiveroute.errors import BadRequest, HiverouteError, NotFound
from hiveroute.gateway.body import read_body
from hiveroute.protocols.common import Message, optional_int
from hiveroute.protocols.prompts import responses_prompt
from hiveroute.protocols.responses import output_messages
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

MAX_STORED = 10_000  # responses one engine keeps (oldest dropped first)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Stored:
    """A stored response: what GET returns, and the conversation a follow-up continues."""

    obj: dict[str, Any]
    messages: list[Message]
    handle: RequestHandle | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class ResponseStore:
    """One engine's stored responses, bounded (least recently stored dropped first)."""

    def __init__(self, limit: int = MAX_STORED) -> None:
        self.limit = limit
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def get(self, response_id: str) -> Stored | None:
        return self._items.get(response_id)

    def put(self, response_id: str, stored: Stored) -> None:
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


STORE_KEY = web.AppKey("responses_store", ResponseStore)


class ResponseNotFound(NotFound):
    error_type = "invalid_request_error"

    def __init__(self, response_id: str) -> None:
        super().__init__(f"Response with id '{response_id}' not found.", param="response_id")


def _error(status: int, message: str, error_type: str, param: str | None) -> web.Response:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": status}}
    return json_response(body, status=status)


def openai_errors(handler: Handler) -> Handler:
    """vLLM's Responses endpoints answer errors with the HTTP status as `code`."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except HiverouteError as exc:
            return _error(exc.status, exc.message, exc.error_type, exc.param)

    return wrapped


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false", param=name)
    return value


def usage(handle: RequestHandle) -> dict[str, Any]:
    p, o = handle.prompt_tokens, handle.completion_tokens
    return {
        "input_tokens": p,
        "input_tokens_details": {
            "cached_tokens": handle.cached_tokens,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": o,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": p + o,
    }


def _message_item(item_id: str, text: str, status: str, logprobs: Any = None) -> dict[str, Any]:
    content = [] if status == "in_progress" else [_part(text, logprobs)]
    return {
        "id": item_id,
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def _part(text: str, logprobs: Any = None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


@dataclass
class _Request:
    """What one create call asked, kept for building the response object."""

    id: str
    created: int
    model: str
    body: dict[str, Any]
    messages: list[Message]
    stream: bool
    store: bool
    background: bool

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        handle: RequestHandle | None = None,
    ) -> dict[str, Any]:
        body = self.body
        incomplete = (
            {"reason": "max_output_tokens"}
            if handle is not None and handle.finish_reason == "length"
            else None
        )
        tools = body.get("tools") or []
        return {
            "id": self.id,
            "created_at": self.created,
            "incomplete_details": incomplete,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": float(body.get("temperature", 1.0)),
            "tool_choice": body.get("tool_choice", "auto" if tools else "none"),
            "tools": tools,
            "top_p": float(body.get("top_p", 1.0)),
            "background": self.background,
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "previous_response_id": body.get("previous_response_id"),
            "prompt": None,
            "reasoning": None,
            "service_tier": "auto",
            "status": status,
            "text": None,
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": usage(handle) if handle is not None and status != "in_progress" else None,
            "user": body.get("user"),
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }


def _final_status(handle: RequestHandle) -> str:
    if handle.finish_reason == "abort":
        return "cancelled"
    return "incomplete" if handle.finish_reason == "length" else "completed"


@openai_errors
async def create(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    store = request.app[STORE_KEY]
    raw = await read_body(request, MAX_BODY)
    asked: list[_Request] = []

    def plan(body: dict[str, Any]) -> Plan:
        model = check_model(engine, body)
        stream = _flag(body, "stream", False)
        background = _flag(body, "background", False)
        keep = _flag(body, "store", True)
        if background and not keep:
            raise BadRequest("background mode needs store=true", param="background")
        if background and stream:
            raise BadRequest("the simulator does not stream background responses", param="stream")
        previous: list[Message] = []
        previous_output: list[Message] = []
        previous_id = body.get("previous_response_id")
        if previous_id is not None:
            if not isinstance(previous_id, str):
                raise BadRequest(
                    "'previous_response_id' must be a string", param="previous_response_id"
                )
            found = store.get(previous_id)
            if found is None:
                raise ResponseNotFound(previous_id)
            previous, previous_output = found.messages, output_messages(found.obj["output"])
        messages, tokens = responses_prompt(engine.tokenizer, body, previous, previous_output)
        params = sampling_params(
            chat_sampling_fields(
                max_tokens=optional_int(body, "max_output_tokens", minimum=1), source=body
            ),
            chat=True,
            num_prompt_tokens=len(tokens),
            max_model_len=engine.max_model_len,
            default_max_tokens=engine.config.default_max_tokens,
            priority_enabled=engine.config.scheduling_policy == "priority",
        )
        rid = f"resp_{uuid.uuid4().hex[:16]}"
        asked.append(
            _Request(rid, int(time.time()), model, body, messages, stream, keep, background)
        )
        return Plan(tokens, params, stream)

    def failure(message: str, status: int) -> web.Response:
        return _error(status, message, "internal_error", None)

    admitted = await admit(engine, raw, plan, failure)
    if isinstance(admitted, web.Response):
        return admitted
    del raw
    req, handle = asked[0], admitted.handle
    if req.background:
        return _start_background(engine, store, req, handle)
    try:
        if req.stream:
            return await _stream(request, engine, store, req, handle, admitted.drop_after)
        text = "".join([out.text async for out in outputs(handle)])
        item = _message_item(f"msg_{uuid.uuid4().hex[:16]}", text, "completed")
        obj = req.response(_final_status(handle), [item], handle)
        if req.store:
            store.put(req.id, Stored(obj, req.messages))
        return json_response(obj)
    finally:
        engine.abort(handle)  # no-op when it finished; frees the blocks of a client that left


def _start_background(
    engine: SimEngine, store: ResponseStore, req: _Request, handle: RequestHandle
) -> web.Response:
    obj = req.response("queued", [])
    stored = Stored(obj, req.messages, handle)

    async def run() -> None:
        stored.obj = req.response("in_progress", [])
        text = "".join([out.text async for out in outputs(handle)])
        if stored.obj["status"] == "cancelled":
            return
        item = _message_item(f"msg_{uuid.uuid4().hex[:16]}", text, "completed")
        stored.obj = req.response(_final_status(handle), [item], handle)

    stored.task = asyncio.get_running_loop().create_task(run())
    store.put(req.id, stored)
    return json_response(obj)


class _Events:
    """Writes the typed SSE events of one streamed response, numbering them."""

    def __init__(self, resp: web.StreamResponse) -> None:
        self.resp = resp
        self.sequence = 0

    async def send(self, kind: str, payload: dict[str, Any]) -> None:
        data = {**payload, "sequence_number": self.sequence, "type": kind}
        self.sequence += 1
        text = json.dumps(data, separators=(",", ":"))
        await self.resp.write(f"event: {kind}\ndata: {text}\n\n".encode())


async def _stream(
    request: web.Request,
    engine: SimEngine,
    store: ResponseStore,
    req: _Request,
    handle: RequestHandle,
    drop_after: int | None,
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    events = _Events(resp)
    await events.send("response.created", {"response": req.response("in_progress", [])})
    await events.send("response.in_progress", {"response": req.response("in_progress", [])})
    item_id = f"msg_{uuid.uuid4().hex[:16]}"
    at = {"item_id": item_id, "output_index": 0}
    await events.send(
        "response.output_item.added",
        {"item": _message_item(item_id, "", "in_progress"), "output_index": 0},
    )
    await events.send(
        "response.content_part.added", {"content_index": 0, **at, "part": _part("", [])}
    )
    parts: list[str] = []
    sent = 0
    async for out in outputs(handle):
        sent += len(out.token_ids)
        if out.text:
            parts.append(out.text)
            await events.send(
                "response.output_text.delta",
                {"content_index": 0, "delta": out.text, **at, "logprobs": []},
            )
        if out.finish_reason is None and drop_connection(engine, handle, request, sent, drop_after):
            return resp
    if stream_cut(handle, request):
        return resp
    text = "".join(parts)
    await events.send(
        "response.output_text.done", {"content_index": 0, **at, "logprobs": [], "text": text}
    )
    await events.send("response.content_part.done", {"content_index": 0, **at, "part": _part(text)})
    item = _message_item(item_id, text, "completed")
    await events.send("response.output_item.done", {"item": item, "output_index": 0})
    obj = req.response(_final_status(handle), [item], handle)
    if req.store:
        store.put(req.id, Stored(obj, req.messages))
    await events.send("response.completed", {"response": obj})
    await resp.write_eof()
    return resp


@openai_errors
async def retrieve(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    if request.query.get("stream", "false").lower() == "true":
        raise BadRequest("the simulator does not stream stored responses", param="stream")
    found = request.app[STORE_KEY].get(response_id)
    if found is None:
        raise ResponseNotFound(response_id)
    return json_response(found.obj)


@openai_errors
async def cancel(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    response_id = request.match_info["response_id"]
    found = request.app[STORE_KEY].get(response_id)
    if found is None:
        raise ResponseNotFound(response_id)
    if found.obj["status"] not in ("queued", "in_progress") or found.handle is None:
        raise BadRequest("Cannot cancel a synchronous response.", param="response_id")
    found.obj = {**found.obj, "status": "cancelled"}
    engine.abort(found.handle)
    return json_response(found.obj)


def add_routes(app: web.Application) -> None:
    app[STORE_KEY] = ResponseStore()
    app.router.add_post("/v1/responses", create)
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel)
