"""The live page at /dashboard and the JSON it reads: served by the router, no build step.

The page is one static HTML file with its script inline (no CDN: the router may run offline).
It reads `/dashboard/api/overview` (engines, load, cache use) and the workflow API
(`/v1/workflows`, `/v1/workflows/{id}`) directly, so the timeline draws exactly the numbers that
API returns. Auth: /dashboard* needs the admin key when keys are configured (gateway/auth.py);
the page takes it from `?key=` and sends it on as a bearer token in its own requests.
"""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from hiveroute.engines.pool import EnginePool
from hiveroute.kvindex.service import KvEventService
from hiveroute.observability.metrics import RouterMetrics

DASHBOARD_HEADERS = {
    "Cache-Control": "no-store",
    # Everything the page needs is inline or same-origin; nothing may load from elsewhere.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def dashboard_html() -> bytes:
    return resources.files("hiveroute.observability").joinpath("static/dashboard.html").read_bytes()


def _by_engine(counter: Counter) -> dict[str, float]:
    """Sum a counter's `_total` samples per engine label, whatever its other labels."""
    sums: dict[str, float] = {}
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and "engine" in sample.labels:
                engine = sample.labels["engine"]
                sums[engine] = sums.get(engine, 0.0) + sample.value
    return sums


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 6) if whole > 0 else None


def _kv_events(service: KvEventService | None, engine: str) -> dict[str, Any] | None:
    """Whether the engine's KV events arrive (None: the router does not subscribe to it)."""
    if service is None or engine not in service.subscribers:
        return None
    staleness = service.staleness
    seconds = staleness.seconds_since_event(engine)
    return {
        "endpoint": service.subscribers[engine].endpoint,
        "received": staleness.received_any(engine),
        "seconds_since_event": None if seconds is None else round(seconds, 3),
        "stale": staleness.is_stale(engine),
    }


def overview(
    pool: EnginePool, m: RouterMetrics, policy: str, kv_events: KvEventService | None = None
) -> dict[str, Any]:
    """Engines with their health, load and cache use, and fleet totals."""
    requests = _by_engine(m.requests.metric)
    prompt = _by_engine(m.prompt_tokens.metric)
    cached = _by_engine(m.cached_tokens.metric)
    cross = _by_engine(m.cross_agent_cached_tokens.metric)
    if kv_events is not None:
        kv_events.check_staleness()
    engines = []
    for e in pool.engines:
        p, c = prompt.get(e.name, 0.0), cached.get(e.name, 0.0)
        engines.append(
            {
                **e.status(),
                "queue_depth": e.load.queue_depth,
                "requests": int(requests.get(e.name, 0.0)),
                "prompt_tokens": int(p),
                "cached_tokens": int(c),
                "cross_agent_cached_tokens": int(cross.get(e.name, 0.0)),
                "hit_rate": _ratio(c, p),
                "kv_events": _kv_events(kv_events, e.name),
            }
        )
    total_prompt = sum(prompt.values())
    total_cached = sum(cached.values())
    total_cross = sum(cross.values())
    return {
        "object": "dashboard.overview",
        "generated_at": time.time(),
        "policy": policy,
        "engines": engines,
        "totals": {
            "engines": len(engines),
            "healthy_engines": sum(1 for e in engines if e["healthy"]),
            "in_flight": sum(e.load.in_flight for e in pool.engines),
            "requests": int(sum(requests.values())),
            "prompt_tokens": int(total_prompt),
            "cached_tokens": int(total_cached),
            "cross_agent_cached_tokens": int(total_cross),
            "hit_rate": _ratio(total_cached, total_prompt),
            "cross_agent_hit_rate": _ratio(total_cross, total_prompt),
        },
    }


def add_dashboard_routes(
    app: web.Application,
    pool: EnginePool,
    metrics: RouterMetrics,
    policy: str,
    kv_events: KvEventService | None = None,
) -> None:
    """GET /dashboard (the page) and GET /dashboard/api/overview (its engine data)."""

    async def page(request: web.Request) -> web.Response:
        return web.Response(
            body=dashboard_html(),
            content_type="text/html",
            charset="utf-8",
            headers=DASHBOARD_HEADERS,
        )

    async def api_overview(request: web.Request) -> web.Response:
        return web.json_response(
            overview(pool, metrics, policy, kv_events), headers={"Cache-Control": "no-store"}
        )

    app.router.add_get("/dashboard", page)
    app.router.add_get("/dashboard/", page)
    app.router.add_get("/dashboard/api/overview", api_overview)
