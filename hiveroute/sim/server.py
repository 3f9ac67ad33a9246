"""The HTTP face of one simulated engine: vLLM's OpenAI API shapes, plus a small admin API.

vLLM routes: /v1/completions, /v1/chat/completions, /v1/responses (+ GET and cancel by id,
see responses.py), /v1/messages and /v1/messages/count_tokens (see messages.py), /v1/models,
/tokenize, /detokenize, /health, /version, /metrics, /reset_prefix_cache. Simulator admin (JSON):
GET|POST /sim/faults, POST /sim/events/restart, POST /sim/retain, GET /sim/state.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from hiveroute.errors import BadRequest, HiverouteError, error_body
from hiveroute.gateway.body import parse_json_object, read_body
from hiveroute.kvindex.tokenizer import prompt_token_ids
from hiveroute.sim import messages, responses
from hiveroute.sim.engine import Output, RequestHandle, SimEngine
from hiveroute.sim.intake import ENGINE_KEY, MAX_BODY, Plan, admit, check_model
from hiveroute.sim.intake import json_response as _json
from hiveroute.sim.requests import sampling_params, stream_options

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _failure(message: str, status: int) -> web.Response:
    return _json(error_body(message, "internal_error"), status=status)


def _error(exc: HiverouteError) -> web.Response:
    return _json(exc.to_json(), status=exc.status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except HiverouteError as exc:
        return _error(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        message = f"{request.method} {request.path}: {exc.reason}"
        return _json(error_body(message, kind, code=str(exc.status)), status=exc.status)


async def _body(request: web.Request) -> dict[str, Any]:
    return parse_json_object(await read_body(request, MAX_BODY))


def _usage(handle: RequestHandle, details: bool) -> dict[str, Any]:
    p, c = handle.prompt_tokens, handle.completion_tokens
    return {
        "prompt_tokens": p,
        "total_tokens": p + c,
        "completion_tokens": c,
        "prompt_tokens_details": {"cached_tokens": handle.cached_tokens} if details else None,
    }


def _request_id(request: web.Request, prefix: str) -> str:
    given = request.headers.get("X-Request-Id")
    return f"{prefix}-{given}" if given else f"{prefix}-{uuid.uuid4().hex}"


async def generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    raw = await read_body(request, MAX_BODY)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    asked: dict[str, Any] = {}

    def plan(body: dict[str, Any]) -> Plan:
        asked["model"] = check_model(engine, body)
        stream, asked["include_usage"] = stream_options(body)
        asked["stream"] = stream
        tokens = prompt_token_ids(engine.tokenizer, path, body)
        params = sampling_params(
            body,
            chat=chat,
            num_prompt_tokens=len(tokens),
            max_model_len=engine.max_model_len,
            default_max_tokens=engine.config.default_max_tokens,
            priority_enabled=engine.config.scheduling_policy == "priority",
        )
        return Plan(tokens, params, stream)

    admitted = await admit(engine, raw, plan, _failure)
    if isinstance(admitted, web.Response):
        return admitted
    handle, drop_after = admitted.handle, admitted.drop_after
    model, include_usage = asked["model"], asked["include_usage"]
    stream: bool = asked["stream"]
    rid = _request_id(request, "chatcmpl" if chat else "cmpl")
    created = int(time.time())
    # The engine keeps its own copy of the prompt; this frame lives as long as the stream, and
    # its lists of ids would be walked by every pass of the garbage collector until then.
    del raw
    try:
        if stream:
            return await _stream(
                request, engine, handle, rid, created, model, chat, include_usage, drop_after
            )
        return await _complete(engine, handle, rid, created, model, chat)
    finally:
        engine.abort(handle)  # no-op when it finished; frees the blocks of a client that left
        # The stream writer refers to the handle: dropping the handle's reference to it breaks
        # the cycle, so the request is freed now rather than by a full pass of the collector.
        handle.sink = None


async def _complete(
    engine: SimEngine, handle: RequestHandle, rid: str, created: int, model: str, chat: bool
) -> web.Response:
    parts: list[str] = []
    handle.sink = lambda out: parts.append(out.text)
    await handle.done
    text = "".join(parts)
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [],
                "reasoning_content": None,
            },
            "logprobs": None,
            "finish_reason": handle.finish_reason,
            "stop_reason": handle.stop_reason,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": handle.finish_reason,
            "stop_reason": handle.stop_reason,
            "prompt_logprobs": None,
        }
        obj = "text_completion"
    return _json(
        {
            "id": rid,
            "object": obj,
            "created": created,
            "model": model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": _usage(handle, engine.config.enable_prompt_tokens_details),
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
    )


class _ChunkWriter:
    """Writes one stream's SSE chunks straight to the socket from the engine's step loop.

    A task switch and an awaited write per token is what limits a Python server at hundreds of
    streams; here each token costs one formatted string, prepared while the step "runs", and
    the socket write (HTTP chunked framing done by hand, after aiohttp has sent the headers)
    happens when the step is due, or, when the engine is falling behind its modelled time,
    with the next few tokens of the stream (`SimEngine.stream_interval`): every chunk is still
    its own SSE event.
    """

    __slots__ = (
        "cache", "chat", "drop_after", "dropped", "engine", "handle", "head", "pending",
        "role_frame", "sent", "transport", "urgent",
    )  # fmt: skip

    def __init__(
        self,
        engine: SimEngine,
        handle: RequestHandle,
        transport: asyncio.Transport,
        head: str,
        chat: bool,
        drop_after: int | None,
    ) -> None:
        self.engine = engine
        self.handle = handle
        self.transport = transport
        self.head = head
        self.chat = chat
        self.drop_after = drop_after
        self.sent = 0
        self.dropped = False
        self.pending: list[bytes] = []
        self.cache: dict[str, bytes] = {}
        self.urgent = False  # a pending chunk is the first token or the last: never held
        # vLLM's chat stream opens with a role-only chunk, sent with the first token's
        self.role_frame: bytes | None = self._role_frame() if chat else None

    def __call__(self, out: Output) -> None:
        framed = self.cache.get(out.text) if out.finish_reason is None else None
        if framed is None:
            framed = self._frame(out)
            if out.finish_reason is None and len(self.cache) < 256:
                self.cache[out.text] = framed  # the simulated model repeats a few pieces
        if not self.sent:
            self.urgent = True
            if self.role_frame is not None:
                self.pending.append(self.role_frame)
        elif out.finish_reason is not None:
            self.urgent = True
        self.pending.append(framed)
        self.sent += len(out.token_ids)
        engine = self.engine
        if (
            self.drop_after is not None
            and self.sent >= self.drop_after
            and out.finish_reason is None
        ):
            self.flush()
            self.dropped = True
            engine.abort(self.handle)
            self.transport.abort()  # fault: the connection dies mid-stream
        elif engine.in_step or (not self.urgent and engine.stream_interval):
            engine.outbox.add(self)  # written when the step is due (or the interval is up)
        else:
            self.flush()

    def _role_frame(self) -> bytes:
        choice = '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}'
        return self._chunk(f"data: {self.head}{choice}]}}\n\n".encode())

    @staticmethod
    def _chunk(data: bytes) -> bytes:
        return b"%x\r\n%b\r\n" % (len(data), data)

    def _frame(self, out: Output) -> bytes:
        """One SSE event as an HTTP chunk."""
        text = _dumps(out.text)
        if self.chat:
            choice = f'{{"index":0,"delta":{{"content":{text}}},"logprobs":null,"finish_reason":'
        else:
            choice = f'{{"index":0,"text":{text},"logprobs":null,"finish_reason":'
        if out.finish_reason is None:
            choice += "null}"
        else:
            choice += f'"{out.finish_reason}","stop_reason":{_dumps(out.stop_reason)}}}'
        return self._chunk(f"data: {self.head}{choice}]}}\n\n".encode())

    def flush(self) -> None:
        """Send what is pending (called by the engine when the stream's interval is up)."""
        pending = self.pending
        if not pending:
            return
        self.pending = []
        self.urgent = False
        transport = self.transport
        if transport.is_closing():
            self.engine.abort(self.handle)  # the client is gone: free its blocks now
            return
        transport.write(pending[0] if len(pending) == 1 else b"".join(pending))
        engine = self.engine
        engine.chunks_written += len(pending)
        engine.socket_writes += 1


_dumps_cache: dict[Any, str] = {}


def _dumps(value: Any) -> str:
    """json.dumps, memoised for the few distinct pieces the simulated model writes."""
    found = _dumps_cache.get(value)
    if found is None:
        found = json.dumps(value)
        if len(_dumps_cache) < 4096:
            _dumps_cache[value] = found
    return found


async def _stream(
    request: web.Request,
    engine: SimEngine,
    handle: RequestHandle,
    rid: str,
    created: int,
    model: str,
    chat: bool,
    include_usage: bool,
    drop_after: int | None,
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    obj = "chat.completion.chunk" if chat else "text_completion"
    head = f'{{"id":"{rid}","object":"{obj}","created":{created},"model":{json.dumps(model)},"choices":['
    await resp.write(b"")  # sends the headers now, before any chunk goes to the socket
    transport = request.transport
    if transport is None:
        return resp
    writer = _ChunkWriter(engine, handle, transport, head, chat, drop_after)
    handle.sink = writer
    while not handle.queue.empty():  # tokens of steps that ended while the headers went out
        writer(handle.queue.get_nowait())
    writer.flush()  # those steps are over: their tokens are due now
    await handle.done
    if writer.dropped or handle.finish_reason == "abort" or transport.is_closing():
        return resp
    if include_usage:
        usage = json.dumps(_usage(handle, engine.config.enable_prompt_tokens_details))
        await resp.write(f'data: {head}],"usage":{usage}}}\n\n'.encode())
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, chat=True)


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    name = engine.model_name
    return _json(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": name,
                    "parent": None,
                    "max_model_len": engine.max_model_len,
                    "permission": [],
                }
            ],
        }
    )


async def tokenize(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    check_model(engine, body)
    if "messages" in body:
        add = body.get("add_special_tokens", False)
        if not isinstance(add, bool):
            raise BadRequest(
                "'add_special_tokens' must be true or false", param="add_special_tokens"
            )
        if add:
            messages = body.get("messages")
            if not isinstance(messages, list):
                raise BadRequest("'messages' must be a list", param="messages")
            text = engine.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                tools=body.get("tools"),
            )
            tokens = engine.tokenizer.encode(text, add_special_tokens=True)
        else:
            tokens = prompt_token_ids(engine.tokenizer, "/v1/chat/completions", body)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string (or send 'messages')", param="prompt")
        add = body.get("add_special_tokens", True)
        if not isinstance(add, bool):
            raise BadRequest(
                "'add_special_tokens' must be true or false", param="add_special_tokens"
            )
        tokens = engine.tokenizer.encode(prompt, add_special_tokens=add)
    strs = None
    if body.get("return_token_strs"):
        strs = [engine.tokenizer.decode([t]) for t in tokens]
    return _json(
        {
            "count": len(tokens),
            "max_model_len": engine.max_model_len,
            "tokens": tokens,
            "token_strs": strs,
        }
    )


async def detokenize(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    check_model(engine, body)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise BadRequest("'tokens' must be a list of integers", param="tokens")
    return _json({"prompt": engine.tokenizer.decode(tokens)})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return _json({"version": "hiveroute-sim (vLLM 0.32 API)"})


async def metrics(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.Response(
        body=engine.render_metrics(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


async def reset_prefix_cache(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if not engine.reset_prefix_cache():
        return _json(
            error_body(
                "cannot reset the prefix cache while requests hold blocks", "internal_error"
            ),
            status=500,
        )
    return web.Response(status=200)


async def get_faults(request: web.Request) -> web.Response:
    return _json(request.app[ENGINE_KEY].faults.to_json())


async def set_faults(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    engine.faults.update(await _body(request))
    return _json(engine.faults.to_json())


async def restart_events(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if engine.publisher is None:
        raise BadRequest("this engine publishes no KV events (started with --no-kv-events)")
    await engine.restart_events()
    return _json(
        {"restarted": True, "events": engine.events_endpoint, "replay": engine.replay_endpoint}
    )


async def retain(request: web.Request) -> web.Response:
    """Retention hint: pin the cached blocks of a prefix for `seconds` (0 releases)."""
    engine = request.app[ENGINE_KEY]
    body = await _body(request)
    seconds = body.get("seconds")
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not 0 <= seconds <= 86400
    ):
        raise BadRequest("'seconds' must be a number from 0 to 86400", param="seconds")
    if "prompt_token_ids" in body:
        ids = body["prompt_token_ids"]
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids
        ):
            raise BadRequest(
                "'prompt_token_ids' must be a list of integers", param="prompt_token_ids"
            )
        tokens = [int(t) for t in ids]
    elif "messages" in body:
        tokens = prompt_token_ids(engine.tokenizer, "/v1/chat/completions", body)
    elif "prompt" in body:
        tokens = prompt_token_ids(engine.tokenizer, "/v1/completions", body)
    else:
        raise BadRequest(
            "send 'prompt', 'messages' or 'prompt_token_ids' to say which prefix to keep"
        )
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("'cache_salt' must be a non-empty string", param="cache_salt")
    return _json(engine.retain(tokens, salt, float(seconds)))


async def state(request: web.Request) -> web.Response:
    return _json(request.app[ENGINE_KEY].state())


def build_engine_app(engine: SimEngine) -> web.Application:
    app = web.Application(middlewares=[errors_middleware], client_max_size=MAX_BODY)
    app[ENGINE_KEY] = engine
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    responses.add_routes(app)
    messages.add_routes(app)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_get("/sim/faults", get_faults)
    app.router.add_post("/sim/faults", set_faults)
    app.router.add_post("/sim/events/restart", restart_events)
    app.router.add_post("/sim/retain", retain)
    app.router.add_get("/sim/state", state)
    return app
