"""Running the router: on a port, with its engines, until told to stop."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from hiveroute.assembly import Router, assemble
from hiveroute.config import RouterConfig
from hiveroute.runtime import freeze_startup_objects, wait_for_shutdown_signal

log = logging.getLogger("hiveroute.server")

# what a request in flight is given to finish when the router stops
SHUTDOWN_GRACE_S = 25.0


@dataclass
class RunningRouter:
    router: Router
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_router(
    config: RouterConfig,
    *,
    router: Router | None = None,
    reuse_port: bool = False,
    extend: Callable[[web.Application], None] | None = None,
    before_listening: Callable[[], Awaitable[None]] | None = None,
) -> RunningRouter:
    """Start a router on config.host:config.port (port 0 picks a free one). `reuse_port`: one
    of several processes on the port (`serve --workers`); `extend` adds to the app before it
    starts (a worker's middleware); `before_listening` is awaited once the app is ready and
    before the port takes connections (a worker waits there for its siblings)."""
    router = router or assemble(config)
    app = router.app()
    if extend is not None:
        extend(app)
    # handler_cancellation: a client that disconnects cancels its handler, which closes the
    # upstream connection, which makes the engine abort the request. On shutdown requests in
    # flight get SHUTDOWN_GRACE_S to finish: under `serve --workers` the parent kills a worker
    # that outlives its own wait, so a stream is ended by the router, not cut by the kill.
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S
    )
    await runner.setup()
    if before_listening is not None:
        try:
            await before_listening()
        except BaseException:
            await runner.cleanup()
            raise
    site = web.TCPSite(
        runner,
        config.host,
        config.port,
        backlog=4096,
        reuse_address=True,
        reuse_port=reuse_port or None,
    )
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {config.host}:{config.port}: {exc.strerror}") from None
    port = config.port
    for address in runner.addresses:  # the bound (host, port) pairs; port 0 becomes real here
        port = address[1]
        break
    return RunningRouter(router=router, runner=runner, host=config.host, port=port)


ServeWorkers = Callable[[RouterConfig, int], Awaitable[None]]


async def serve(config: RouterConfig, *, serve_workers: ServeWorkers | None = None) -> None:
    """`hiveroute serve`: the router in front of the configured engines, or embedded ones; in
    one process, or, given `serve_workers` (hiveroute.workers), in `workers` processes."""
    fleet = None
    if not config.engine and config.discovery == "static":
        from hiveroute.sim.embedded import start_embedded_engines

        fleet, specs = await start_embedded_engines(config.embedded_engines)
        config.engine = [spec_text for spec_text in specs]
        log.info("no engine configured: started %d embedded simulated engines", len(specs))
    try:
        workers = config.workers
        if workers > 1 and serve_workers is not None:
            await serve_workers(config, workers)
            return
        running = await start_router(config)
        freeze_startup_objects()
        log.info("hiveroute listening on %s (policy %s)", running.url, running.router.policy.name)
        try:
            await wait_for_shutdown_signal()
        finally:
            await running.stop()
    finally:
        if fleet is not None:
            await fleet.stop()
