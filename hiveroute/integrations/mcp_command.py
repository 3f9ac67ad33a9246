"""`hiveroute mcp`: the MCP server over stdio (for a host that spawns it) or streamable HTTP."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

import anyio

from hiveroute.errors import ConfigError
from hiveroute.integrations.router_api import RouterClient

DEFAULT_ROUTER = "http://127.0.0.1:8080"
ROUTER_ENV = "HIVEROUTE_ROUTER_URL"

log = logging.getLogger("hiveroute.mcp")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (spawned by an MCP host; the default) or streamable HTTP",
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP: address to listen on")
    parser.add_argument("--port", type=int, default=8090, help="HTTP: port (0 picks a free one)")
    parser.add_argument("--path", default="/mcp", help="HTTP: the MCP endpoint path")
    parser.add_argument(
        "--router",
        default=None,
        help=f"the hiveroute router's URL (default ${ROUTER_ENV} or {DEFAULT_ROUTER})",
    )
    parser.add_argument("--model", default=None, help="model for `generate` when none is given")
    parser.add_argument(
        "--api-key", default=None, help="bearer token for the router (default $HIVEROUTE_API_KEY)"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=300.0, help="seconds one router call may take"
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=("debug", "info", "warning", "error"),
        help="log level (logs go to stderr)",
    )


def _router_client(args: argparse.Namespace) -> RouterClient:
    url = args.router or os.environ.get(ROUTER_ENV) or DEFAULT_ROUTER
    if args.timeout_s <= 0:
        raise ConfigError("--timeout-s must be positive")
    try:
        return RouterClient(
            url,
            api_key=args.api_key or os.environ.get("HIVEROUTE_API_KEY"),
            timeout_s=args.timeout_s,
        )
    except ValueError as exc:
        raise ConfigError(f"--router: {exc}") from None


def _listen(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be 0..65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host!r} does not resolve: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


async def _serve(args: argparse.Namespace, router: RouterClient) -> None:
    from hiveroute.integrations.mcp_server import build_mcp_server

    server = build_mcp_server(router, default_model=args.model)
    try:
        if args.transport == "stdio":
            await server.run_stdio_async()
            return
        import uvicorn

        path = args.path if args.path.startswith("/") else "/" + args.path
        app = server.streamable_http_app(streamable_http_path=path, host=args.host)
        sock = _listen(args.host, args.port)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        print(
            f"hiveroute mcp: streamable HTTP on http://{shown}:{bound_port}{path} "
            f"(router {router.base_url})",
            file=sys.stderr,
            flush=True,
        )
        config = uvicorn.Config(app, log_level=args.log_level, lifespan="on")
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        await router.close()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s %(message)s"
    )
    router = _router_client(args)
    try:
        anyio.run(_serve, args, router)
    except OSError as exc:
        print(f"hiveroute mcp: {exc}", file=sys.stderr)
        return 1
    return 0
