"""Taking a generation request into a simulated engine, whatever API it came through.

Chat completions, completions, Responses and Messages differ in how they read a body and write
an answer; they share this: one request at a time through the engine's intake (in arrival
order, as vLLM's scheduler sees them), the fault knobs, and the submission to the step loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from hiveroute.errors import BadRequest, NotFound
from hiveroute.gateway.body import parse_json_object
from hiveroute.sim.engine import Output, RequestHandle, SamplingParams, SimEngine

INTAKE_MAX_WAIT = 0.002  # seconds a request's intake may wait for a gap between step ends
ENGINE_KEY = web.AppKey("engine", SimEngine)
MAX_BODY = 64 * 1024 * 1024


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
    )


def check_model(engine: SimEngine, body: dict[str, Any]) -> str:
    """The served model's name; a request naming another model gets vLLM's 404."""
    model = body.get("model")
    if model is None:
        return engine.model_name
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    if model != engine.model_name:
        raise NotFound(
            f"The model `{model}` does not exist.", param="model", code="model_not_found"
        )
    return model


@dataclass
class Plan:
    """What a parsed request asks of the engine."""

    tokens: list[int]
    params: SamplingParams
    stream: bool


@dataclass
class Admitted:
    handle: RequestHandle
    drop_after: int | None  # fault knob: the stream dies after this many tokens


async def admit(
    engine: SimEngine,
    raw: bytes,
    plan: Callable[[dict[str, Any]], Plan],
    failure: Callable[[str, int], web.Response],
) -> Admitted | web.Response:
    """Parse, plan and submit one request through the engine's intake.

    `plan` reads the parsed body (raising BadRequest and friends for bad input); `failure` builds
    the API's own error answer for the fault knob `fail_fraction`.
    """
    # The intake may wait a moment for a gap between the engines' step ends (see deadlines.py),
    # but never more than INTAKE_MAX_WAIT: that wait adds to the request's TTFT one for one.
    async with engine.intake_lock:
        await engine.board.gap(
            engine.intake_cost.seconds(len(raw)), latest=time.monotonic() + INTAKE_MAX_WAIT
        )
        started = time.perf_counter()
        planned = plan(parse_json_object(raw))
        faults = engine.faults
        if faults.should_fail():
            return failure(
                "simulated engine failure (fault knob fail_fraction)", faults.fail_status
            )
        drop_after = faults.drop_after_tokens if planned.stream and faults.should_drop() else None
        stall_s = faults.stall_first_token_s
        handle = None if stall_s > 0 else engine.submit(planned.tokens, planned.params)
        engine.intake_cost.observe(time.perf_counter() - started, len(raw))
    if handle is None:  # a stalled request must not hold up the ones behind it
        await asyncio.sleep(stall_s)
        handle = engine.submit(planned.tokens, planned.params)
    return Admitted(handle, drop_after)


def drop_connection(
    engine: SimEngine,
    handle: RequestHandle,
    request: web.Request,
    sent: int,
    drop_after: int | None,
) -> bool:
    """The mid-stream fault (`drop_after` tokens sent, the request not finished): abort the
    request and kill the connection. True when it fired, and the stream must end here."""
    if drop_after is None or sent < drop_after:
        return False
    engine.abort(handle)
    if request.transport is not None:
        request.transport.abort()  # fault: the connection dies mid-stream
    return True


def stream_cut(handle: RequestHandle, request: web.Request) -> bool:
    """The stream cannot finish: the request was aborted or its client went away."""
    transport = request.transport
    return handle.finish_reason == "abort" or (transport is not None and transport.is_closing())


async def outputs(handle: RequestHandle) -> AsyncIterator[Output]:
    """The request's outputs as they come (for APIs that frame each one themselves), ending
    with the output that finishes it, or when it is aborted."""
    queue = handle.queue
    while True:
        if queue.empty():
            if handle.done.done():
                return
            getter: asyncio.Future[Output] = asyncio.ensure_future(queue.get())
            waiting: set[asyncio.Future[Any]] = {getter, handle.done}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            out = getter.result()
        else:
            out = queue.get_nowait()
        yield out
        if out.finish_reason is not None:
            return


def chat_sampling_fields(
    *,
    max_tokens: int | None,
    stop: Any = None,
    source: dict[str, Any],
) -> dict[str, Any]:
    """A chat-completions-like dict of the fields `sampling_params` reads, from another API's
    body (vLLM converts both APIs to chat requests the same way)."""
    fields: dict[str, Any] = {"max_tokens": max_tokens, "stop": stop}
    for name in ("priority", "cache_salt", "ignore_eos", "min_tokens"):
        if name in source:
            fields[name] = source[name]
    return fields
