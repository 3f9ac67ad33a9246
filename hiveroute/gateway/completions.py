"""The handler behind /v1/completions and /v1/chat/completions."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from aiohttp import web

from hiveroute.errors import HiverouteError, NoEngineAvailable, NotFound, TooManyRequests
from hiveroute.gateway.access_log import log_request
from hiveroute.gateway.auth import principal_of
from hiveroute.gateway.body import check_openai_fields, parse_json_object, read_body
from hiveroute.gateway.proxy import (
    EngineUnreachable,
    RelayResult,
    UpstreamAnswer,
    relay_stream,
    relay_whole,
    send_upstream,
    upstream_headers,
)
from hiveroute.gateway.router import Router
from hiveroute.metadata import extract_metadata
from hiveroute.observability.tracing import RequestSpan
from hiveroute.routing.base import CycleState, Decision, RequestOutcome, RoutingRequest

ROUTER_KEY: web.AppKey[Router] = web.AppKey("router", Router)


def status_class(status: int) -> str:
    return f"{status // 100}xx"


async def handle_completion(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    span = None
    if router.tracing is not None:
        span = router.tracing.start_span(request.method, request.path, request.headers)
    try:
        async with router.admission.admit():
            return await _route_and_relay(router, request, span)
    except TooManyRequests as exc:
        router.metrics.rejected.labels("overloaded").inc()
        if span is not None:
            span.fail(exc.status, exc.message)
        raise
    except HiverouteError as exc:
        if span is not None:
            span.fail(exc.status, exc.message)
        raise
    except (ConnectionResetError, asyncio.CancelledError):
        if span is not None:
            span.fail(499, "client disconnected")
        raise
    finally:
        if span is not None:
            span.end()


async def _route_and_relay(
    router: Router, request: web.Request, span: RequestSpan | None
) -> web.StreamResponse:
    config = router.config
    started = time.perf_counter()
    request_id = request.headers.get("X-Request-Id") or f"hr-{uuid.uuid4().hex}"
    path = request.path
    raw = await read_body(request, config.max_body_bytes)
    body = parse_json_object(raw)
    check_openai_fields(body, chat=path.endswith("/chat/completions"))
    metadata, clean = extract_metadata(body, request.headers)
    tenant = principal_of(request).tenant
    if tenant is not None:  # tenants never share KV blocks (see gateway/auth.py)
        clean = {**clean, "cache_salt": router.auth.cache_salt(tenant)}
    routing_request = RoutingRequest(
        request_id=request_id, path=path, body=clean, metadata=metadata, tenant=tenant
    )
    model = routing_request.model
    if span is not None:
        span.set_request(request_id, model, metadata)
    if model is not None and not router.pool.any_serves(model):
        served = sorted(router.pool.known_models())
        listed = ", ".join(repr(m) for m in served[:20]) + (" ..." if len(served) > 20 else "")
        raise NotFound(
            f"model {model!r} is not served by any engine; served: {listed or 'none yet'} "
            "(GET /v1/models lists them)",
            param="model",
            code="model_not_found",
        )
    for hook in router.request_hooks:
        await hook.before_route(routing_request)
    stream = bool(routing_request.body.get("stream"))
    payload = raw if routing_request.body is body else json.dumps(routing_request.body).encode()
    headers = upstream_headers(
        request,
        request_id,
        forward_authorization=not router.auth.enabled,
        engine_api_key=config.engine_api_key,
    )
    if span is not None:
        span.inject(headers)
    state = CycleState()
    policy = router.policy
    await policy.prepare(routing_request, state)

    answer: UpstreamAnswer | None = None
    decision: Decision | None = None
    tried: set[str] = set()
    last_error = "no healthy engine"
    for attempt in range(config.retries + 1):
        candidates = [e for e in router.pool.candidates(model) if e.name not in tried]
        if not candidates:
            break
        decision = policy.choose(routing_request, candidates, state)
        engine = decision.engine
        tried.add(engine.name)
        if attempt == 0:
            router.metrics.overhead.labels(policy.name).observe(time.perf_counter() - started)
        router.metrics.decisions.labels(policy.name, decision.reason).inc()
        if span is not None:
            span.set_routed(engine.name, policy.name, decision.reason, attempt)
        policy.on_routed(routing_request, engine, state)
        engine.load.in_flight += 1
        try:
            answer = await send_upstream(
                router.session,
                engine,
                path,
                payload,
                headers,
                stream=stream,
                connect_timeout_s=config.connect_timeout_s,
                first_byte_timeout_s=config.first_byte_timeout_s,
                request_timeout_s=config.request_timeout_s,
            )
        except EngineUnreachable as exc:
            engine.load.in_flight -= 1
            last_error = str(exc)
            router.pool.report_failure(engine, last_error, slow=exc.slow)
            router.metrics.retries.labels(engine.name).inc()
            policy.on_completed(
                routing_request, RequestOutcome(engine=engine, status=502, error=last_error), state
            )
            continue
        except BaseException:  # cancelled while waiting: nothing may stay counted
            engine.load.in_flight -= 1
            policy.on_completed(
                routing_request, RequestOutcome(engine=engine, status=499, error="cancelled"), state
            )
            raise
        if answer.is_stream:  # a stream's first chunk is its first token: prefill is over
            policy.on_first_token(routing_request, engine, state)
        break
    if answer is None or decision is None:
        router.metrics.rejected.labels("no_engine").inc()
        raise NoEngineAvailable(
            f"no engine could serve this request ({last_error}); try again shortly"
        )

    engine = answer.engine
    extra = {
        "X-Request-Id": request_id,
        "X-Hiveroute-Engine": engine.name,
        "X-Hiveroute-Policy": policy.name,
    }
    result = RelayResult(status=499)
    response: web.StreamResponse | None = None
    try:
        if answer.is_stream:
            response, result = await relay_stream(request, answer, extra, started)
        else:
            response, result = await relay_whole(answer, extra, started)
    except (ConnectionResetError, OSError) as exc:  # the client went away mid-relay
        result.error = f"client disconnected: {type(exc).__name__}"
        answer.response.close()
    finally:
        engine.load.in_flight -= 1
        _finish(router, routing_request, decision, result, state, started, span)
    if response is None:
        raise ConnectionResetError("client disconnected")
    if result.error is not None and result.status < 400:
        router.pool.report_failure(engine, result.error)
    return response


def _finish(
    router: Router,
    routing_request: RoutingRequest,
    decision: Decision,
    result: RelayResult,
    state: CycleState,
    started: float,
    span: RequestSpan | None = None,
) -> None:
    engine = decision.engine
    policy = router.policy.name
    duration = time.perf_counter() - started
    usage = result.usage
    outcome = RequestOutcome(
        engine=engine,
        status=result.status,
        ttft_s=result.ttft_s,
        duration_s=duration,
        prompt_tokens=usage.prompt_tokens if usage else None,
        cached_tokens=usage.cached_tokens if usage else None,
        completion_tokens=usage.completion_tokens if usage else None,
        error=result.error,
    )
    router.policy.on_completed(routing_request, outcome, state)
    for hook in router.request_hooks:
        hook.after_complete(routing_request, outcome)
    metrics = router.metrics
    endpoint = "chat" if routing_request.is_chat else "completions"
    metrics.requests.labels(engine.name, policy, endpoint, status_class(result.status)).inc()
    if result.ttft_s is not None and result.status < 400:
        metrics.ttft.labels(engine.name, policy).observe(result.ttft_s)
    metrics.e2e.labels(engine.name, policy).observe(duration)
    if result.itl_s is not None:
        metrics.itl.labels(engine.name, policy).observe(result.itl_s)
    role = metrics.role_label(routing_request.metadata.agent_role)
    metrics.agent_requests.labels(role).inc()
    if result.ttft_s is not None and result.status < 400:
        metrics.agent_ttft.labels(role).observe(result.ttft_s)
    if usage is not None and usage.prompt_tokens is not None:
        metrics.prompt_tokens.labels(engine.name).inc(usage.prompt_tokens)
        metrics.agent_prompt_tokens.labels(role).inc(usage.prompt_tokens)
        if usage.cached_tokens:
            metrics.cached_tokens.labels(engine.name).inc(usage.cached_tokens)
            metrics.agent_cached_tokens.labels(role).inc(usage.cached_tokens)
    if usage is not None and usage.completion_tokens:
        metrics.completion_tokens.labels(engine.name).inc(usage.completion_tokens)
    if span is not None:
        span.set_outcome(outcome, bool(routing_request.body.get("stream")))
    log_request(
        {
            "request_id": routing_request.request_id,
            "path": routing_request.path,
            "model": routing_request.model,
            **routing_request.metadata.to_log(),
            "engine": engine.name,
            "policy": policy,
            "reason": decision.reason,
            "status": result.status,
            "stream": bool(routing_request.body.get("stream")),
            "ttft_ms": round(result.ttft_s * 1000, 3) if result.ttft_s is not None else None,
            "itl_ms": round(result.itl_s * 1000, 3) if result.itl_s is not None else None,
            "duration_ms": round(duration * 1000, 3),
            "prompt_tokens": outcome.prompt_tokens,
            "cached_tokens": outcome.cached_tokens,
            "completion_tokens": outcome.completion_tokens,
            "error": result.error,
        }
    )
