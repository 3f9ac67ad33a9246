"""`hiveroute mcp`: the MCP server over stdio (for a host that spawns it) or streamable HTTP."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

from hiveroute.errors import ConfigError
from hiveroute.integrations.router_api import RouterClient

DEFAULT_ROUTER = "http://127.0.0.1:8080"
ENV_PREFIX = "HIVEROUTE_MCP_"

log = logging.getLogger("hiveroute.mcp")


def _env(name: str, default: str | None = None) -> str | None:
    """A flag's default from HIVEROUTE_MCP_<NAME> (flags given on the command line win)."""
    return os.environ.get(ENV_PREFIX + name.upper(), default)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve hiveroute's MCP tools (generate, register_context, get_context, workflow_status) "
        "and shared-context resources. Every flag also reads HIVEROUTE_MCP_<FLAG>."
    )
    parser.add_argument(
        "--transport",
        default=_env("transport", "stdio"),
        help="stdio (spawned by an MCP host; the default) or http (streamable HTTP)",
    )
    parser.add_argument("--host", default=_env("host", "127.0.0.1"), help="HTTP: listen address")
    parser.add_argument(
        "--port", default=_env("port", "8090"), help="HTTP: port (0 picks a free one)"
    )
    parser.add_argument("--path", default=_env("path", "/mcp"), help="HTTP: the endpoint path")
    parser.add_argument(
        "--router",
        default=_env("router", os.environ.get("HIVEROUTE_ROUTER_URL", DEFAULT_ROUTER)),
        help=f"the hiveroute router's URL (default {DEFAULT_ROUTER})",
    )
    parser.add_argument(
        "--model", default=_env("model"), help="model for `generate` when none is given"
    )
    parser.add_argument(
        "--api-key",
        default=_env("api_key", os.environ.get("HIVEROUTE_API_KEY")),
        help="bearer token the router wants (also $HIVEROUTE_API_KEY)",
    )
    parser.add_argument(
        "--timeout-s", default=_env("timeout_s", "300"), help="seconds one router call may take"
    )
    parser.add_argument(
        "--log-level", default=_env("log_level", "warning"), help="debug, info, warning, error"
    )


def _number(value: str, flag: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} must be a number, got {value!r}") from None


def _validate(args: argparse.Namespace) -> None:
    """Check every flag (including values that came from the environment)."""
    if args.transport not in ("stdio", "http"):
        raise ConfigError(f"--transport must be stdio or http, got {args.transport!r}")
    args.log_level = str(args.log_level).lower()
    if args.log_level not in ("debug", "info", "warning", "error"):
        raise ConfigError(
            f"--log-level must be debug, info, warning or error, not {args.log_level!r}"
        )
    args.port = int(_number(args.port, "--port", int))
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be 0..65535, got {args.port}")
    args.timeout_s = _number(args.timeout_s, "--timeout-s", float)
    if args.timeout_s <= 0:
        raise ConfigError("--timeout-s must be positive")


def _router_client(args: argparse.Namespace) -> RouterClient:
    try:
        return RouterClient(args.router, api_key=args.api_key, timeout_s=args.timeout_s)
    except ValueError as exc:
        raise ConfigError(f"--router: {exc}") from None


def _listen(host: str, port: int) -> socket.socket:
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
    _validate(args)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s %(message)s"
    )
    router = _router_client(args)
    try:
        from hiveroute.extras import require

        require("mcp", "mcp")
        anyio = require("anyio", "mcp")
        anyio.run(_serve, args, router)
    except OSError as exc:
        print(f"hiveroute mcp: {exc}", file=sys.stderr)
        return 1
    return 0
