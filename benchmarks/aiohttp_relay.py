"""The floor of an aiohttp router: a relay that parses nothing and decides nothing.

    python -m benchmarks.aiohttp_relay PORT --engine URL [--engine URL ...]

It reads a request's body, sends it to the next engine in turn with one shared aiohttp client
session, and streams the answer back: what every hiveroute request also does, with uvloop, on
the same libraries, and nothing else (no JSON parse, no tokenizing, no routing state, no
metrics). `benchmarks.router_cpu --targets aiohttp-relay` measures its CPU per request beside
the routers', so their figures can be read against what the HTTP stack alone costs.
"""

from __future__ import annotations

import argparse
import itertools

import aiohttp
from aiohttp import web

from hiveroute import runtime

_HOP_BY_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive"}


def relay_app(engines: list[str]) -> web.Application:
    """An application relaying every POST to the engines in turn."""
    turn = itertools.cycle(engines)
    app = web.Application()
    sessions: list[aiohttp.ClientSession] = []

    async def open_session(app: web.Application) -> None:
        sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))

    async def close_session(app: web.Application) -> None:
        await sessions[0].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with sessions[0].post(next(turn) + request.path, data=body, headers=headers) as up:
            response = web.StreamResponse(
                status=up.status,
                headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP_BY_HOP},
            )
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    app.router.add_post("/{tail:.*}", relay)
    app.router.add_get("/health", health)
    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("--engine", action="append", required=True)
    args = parser.parse_args()
    runtime.use_fastest_event_loop()
    web.run_app(
        relay_app(args.engine), host="127.0.0.1", port=args.port, print=None, access_log=None
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
