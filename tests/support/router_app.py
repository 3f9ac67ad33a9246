"""A router served on a free loopback port, with the workflow API stand-in where it is missing."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from hiveroute.gateway.app import build_app
from hiveroute.gateway.router import Router
from tests.support.workflow_standin import WorkflowStandIn


@dataclass
class ServedRouter:
    router: Router
    runner: web.AppRunner
    url: str
    standin: WorkflowStandIn | None

    async def stop(self) -> None:
        await self.runner.cleanup()


def has_route(app: web.Application, method: str, path: str) -> bool:
    return any(
        r.method == method and r.resource is not None and r.resource.canonical == path
        for r in app.router.routes()
    )


async def serve_router(router: Router) -> ServedRouter:
    """Serve `router`; without the real workflow registry, install the stand-in (it observes
    the workflow metrics into the router's registry as the real one does)."""
    app = build_app(router)
    standin = None
    if not has_route(app, "GET", "/v1/workflows/{id}"):
        standin = WorkflowStandIn(router.metrics)
        standin.install(app, router.request_hooks)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return ServedRouter(router, runner, f"http://127.0.0.1:{port}", standin)
