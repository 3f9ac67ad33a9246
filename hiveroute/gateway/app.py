"""The aiohttp application: routes, JSON errors, request ids, and the read-only endpoints."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web

from hiveroute.errors import HiverouteError, TooManyRequests
from hiveroute.gateway import messages, responses
from hiveroute.gateway.apis import api_of_path
from hiveroute.gateway.completions import handle_completion
from hiveroute.gateway.parts import GATEWAY_KEY, GatewayParts
from hiveroute.gateway.request_ids import request_ids
from hiveroute.lifecycle import Component

log = logging.getLogger("hiveroute.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Mount = Callable[[web.Application], None]


def json_error(
    status: int, body: dict[str, object], headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error becomes a JSON body in the shape of the path's API (OpenAI's, Anthropic's
    on /v1/messages); no stack trace ever reaches a client."""
    shape = api_of_path(request.path).error_json
    try:
        return await handler(request)
    except HiverouteError as exc:
        headers = None
        if isinstance(exc, TooManyRequests):
            headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
        return json_error(exc.status, shape(exc), headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = {
            404: f"no route {request.method} {request.path}",
            405: f"method {request.method} is not allowed on {request.path}",
        }.get(exc.status, exc.reason)
        kept = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}  # RFC 9110 on 405
        refusal = HiverouteError(message)
        refusal.status, refusal.error_type = exc.status, "invalid_request_error"
        return json_error(exc.status, shape(refusal), kept or None)
    except ConnectionResetError:
        # The client went away mid-request: already counted (status 499) and nothing can be
        # sent; a stack trace in the log would only alarm whoever reads it.
        log.debug("client disconnected on %s %s", request.method, request.path)
        return web.Response(status=499)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_error(500, shape(HiverouteError("internal router error; see the router's log")))


async def handle_models(request: web.Request) -> web.Response:
    pool = request.app[GATEWAY_KEY].pool
    now = int(time.time())
    data = [
        {"id": model, "object": "model", "created": now, "owned_by": "hiveroute"}
        for model in sorted(pool.known_models())
    ]
    return web.json_response({"object": "list", "data": data})


async def handle_health(request: web.Request) -> web.Response:
    parts = request.app[GATEWAY_KEY]
    engines = [e.status() for e in parts.pool.engines]
    healthy = sum(1 for e in engines if e["healthy"])
    status = (
        "ok" if healthy == len(engines) and engines else ("degraded" if healthy else "unavailable")
    )
    return web.json_response(
        {
            "status": status,
            "policy": parts.policy.name,
            "engines": engines,
            "panic_routings": parts.pool.panic_routings,
        },
        status=200 if healthy else 503,
    )


async def handle_metrics(request: web.Request) -> web.Response:
    parts = request.app[GATEWAY_KEY]
    metrics = parts.metrics
    for engine in parts.pool.engines:
        metrics.engine_up.labels(engine.name).set(1 if engine.healthy else 0)
        metrics.engine_queue.labels(engine.name).set(engine.load.queue_depth)
        metrics.engine_kv_usage.labels(engine.name).set(engine.load.kv_usage)
        metrics.in_flight.labels(engine.name).set(engine.load.in_flight)
        metrics.known_engine(engine.name)
    return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")


def build_app(
    parts: GatewayParts, lifecycle: Component, mounts: Sequence[Mount] = ()
) -> web.Application:
    """The router's app: the OpenAI endpoints, plus what `mounts` add (the control API, the
    dashboard); `lifecycle` is started and stopped with it."""
    # The body limit is enforced by read_body (413 with a clear message); this is a backstop.
    app = web.Application(
        middlewares=[
            request_ids(parts.metrics, parts.policy.name, errors_as_json),
            parts.auth.middleware(),
        ],
        client_max_size=parts.config.max_body_bytes + 1024,
    )
    app[GATEWAY_KEY] = parts
    app.router.add_post("/v1/completions", handle_completion)
    app.router.add_post("/v1/chat/completions", handle_completion)
    responses.add_routes(app)
    messages.add_routes(app)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    for mount in mounts:
        mount(app)

    async def lifecycle_ctx(app: web.Application) -> AsyncIterator[None]:
        await lifecycle.start()
        yield
        await lifecycle.stop()

    app.cleanup_ctx.append(lifecycle_ctx)
    return app
