"""The aiohttp application: routes, JSON errors, and the read-only endpoints."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from hiveroute.errors import HiverouteError, TooManyRequests, error_body
from hiveroute.gateway.completions import ROUTER_KEY, handle_completion
from hiveroute.gateway.router import Router
from hiveroute.observability.dashboard import add_dashboard_routes

log = logging.getLogger("hiveroute.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(
    status: int, body: dict[str, object], headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error becomes an OpenAI-style JSON body; no stack trace ever reaches a client."""
    try:
        return await handler(request)
    except HiverouteError as exc:
        headers = None
        if isinstance(exc, TooManyRequests):
            headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
        return json_error(exc.status, exc.to_json(), headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = {
            404: f"no route {request.method} {request.path}",
            405: f"method {request.method} is not allowed on {request.path}",
        }.get(exc.status, exc.reason)
        kept = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}  # RFC 9110 on 405
        return json_error(exc.status, error_body(message, "invalid_request_error"), kept or None)
    except ConnectionResetError:
        # The client went away mid-request: already counted (status 499) and nothing can be
        # sent; a stack trace in the log would only alarm whoever reads it.
        log.debug("client disconnected on %s %s", request.method, request.path)
        return web.Response(status=499)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return json_error(
            500, error_body("internal router error; see the router's log", "internal_error")
        )


async def handle_models(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    now = int(time.time())
    data = [
        {"id": model, "object": "model", "created": now, "owned_by": "hiveroute"}
        for model in sorted(router.pool.known_models())
    ]
    return web.json_response({"object": "list", "data": data})


async def handle_health(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    engines = [e.status() for e in router.pool.engines]
    healthy = sum(1 for e in engines if e["healthy"])
    status = (
        "ok" if healthy == len(engines) and engines else ("degraded" if healthy else "unavailable")
    )
    return web.json_response(
        {
            "status": status,
            "policy": router.policy.name,
            "engines": engines,
            "panic_routings": router.pool.panic_routings,
        },
        status=200 if healthy else 503,
    )


async def handle_metrics(request: web.Request) -> web.Response:
    router = request.app[ROUTER_KEY]
    metrics = router.metrics
    for engine in router.pool.engines:
        metrics.engine_up.labels(engine.name).set(1 if engine.healthy else 0)
        metrics.engine_queue.labels(engine.name).set(engine.load.queue_depth)
        metrics.engine_kv_usage.labels(engine.name).set(engine.load.kv_usage)
        metrics.in_flight.labels(engine.name).set(engine.load.in_flight)
        metrics.known_engine(engine.name)
    return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")


def build_app(router: Router) -> web.Application:
    # The body limit is enforced by read_body (413 with a clear message); this is a backstop.
    app = web.Application(
        middlewares=[errors_as_json, router.auth.middleware()],
        client_max_size=router.config.max_body_bytes + 1024,
    )
    app[ROUTER_KEY] = router
    app.router.add_post("/v1/completions", handle_completion)
    app.router.add_post("/v1/chat/completions", handle_completion)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    from hiveroute.workflows.api import add_routes

    add_routes(app, router)  # /v1/workflows, /v1/contexts
    add_dashboard_routes(app, router)

    async def lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        await router.start()
        yield
        await router.stop()

    app.cleanup_ctx.append(lifecycle)
    return app
