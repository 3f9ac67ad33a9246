"""Every response carries X-Request-Id (the client's if it sent one), is logged and counted.

Completions are finished by the RequestPipeline (one log line, one count, with engine and
usage); any other response under /v1/ (the model list, the control API) and any error elsewhere
(403 on the dashboard, 404 for no route, 405) is logged and counted here, with engine "none".
/health and /metrics, polled by probes and scrapers, only get the header.
"""

from __future__ import annotations

import itertools
import os
import secrets
import time

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from hiveroute.gateway.access_log import log_request
from hiveroute.observability.metrics import RouterMetrics

REQUEST_ID: web.RequestKey[str] = web.RequestKey("request_id", str)
FINISHED: web.RequestKey[bool] = web.RequestKey("finished", bool)  # logged and counted already
NO_ENGINE = "none"
UNCOUNTED_PATHS = frozenset({"/health", "/metrics"})  # polled by probes and scrapers


class RequestIdSource:
    """Request ids unique across processes and requests: a random 64-bit prefix per process
    (drawn again in a forked child) and a counter. One read of the kernel's random source per
    process, not one (and a UUID object) per request."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = f"hr-{secrets.token_hex(8)}"
        self._count = itertools.count()

    def new(self) -> str:
        return f"{self._prefix}{next(self._count):016x}"


new_request_id = RequestIdSource().new


def request_id_of(request: web.Request) -> str:
    """The request's id: the client's X-Request-Id, else one made up now (once per request)."""
    found = request.get(REQUEST_ID)
    if found is None:
        found = request.headers.get("X-Request-Id") or new_request_id()
        request[REQUEST_ID] = found
    return found


def mark_finished(request: web.Request) -> None:
    request[FINISHED] = True


def status_class(status: int) -> str:
    return f"{status // 100}xx"


def endpoint_label(path: str) -> str:
    """The bounded `endpoint` label of a path (never the path itself)."""
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completions"
    parts = path.strip("/").split("/")
    known = {"models", "workflows", "contexts", "responses", "messages"}
    return parts[1] if len(parts) > 1 and parts[0] == "v1" and parts[1] in known else "other"


def request_ids(metrics: RouterMetrics, policy: str, errors: Middleware) -> Middleware:
    """The outermost middleware: the header on every response, a log line and a count.

    `errors` (which turns errors into answers) runs inside it as a plain call, not as one more
    middleware layer: one layer less on every request."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        request_id = request_id_of(request)
        response = await errors(request, handler)
        if not response.prepared:
            response.headers["X-Request-Id"] = request_id
        status = response.status
        if request.get(FINISHED) or request.path in UNCOUNTED_PATHS:
            return response
        if status < 400 and not request.path.startswith("/v1/"):
            return response  # the dashboard's page and data: not API requests
        endpoint = endpoint_label(request.path)
        metrics.requests.labels(NO_ENGINE, policy, endpoint, status_class(status)).inc()
        log_request(
            {
                "request_id": request_id,
                "method": request.method,
                "path": request.path,
                "engine": None,
                "policy": policy,
                "status": status,
                "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            }
        )
        return response

    return middleware
