"""A router served on a free loopback port from an app the test may look at (routes, state)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from hiveroute.assembly import Router


@dataclass
class ServedRouter:
    router: Router
    runner: web.AppRunner
    url: str

    async def stop(self) -> None:
        await self.runner.cleanup()


async def serve_router(router: Router) -> ServedRouter:
    """Serve `router` (its workflow API included) on 127.0.0.1 and a free port."""
    runner = web.AppRunner(router.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return ServedRouter(router, runner, f"http://127.0.0.1:{port}")
