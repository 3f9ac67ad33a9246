"""The `hiveroute` command: serve | sim | demo | bench | mcp.

Each subcommand lives in the module of its component and exposes `configure(parser)` and
`run(args) -> int`; this file only wires them together.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hiveroute import __version__
from hiveroute.errors import ConfigError

SUBCOMMANDS = {
    "serve": ("hiveroute.gateway.serve_command", "run the router"),
    "sim": ("hiveroute.sim.command", "run simulated vLLM engines"),
    "demo": ("hiveroute.bench.demo", "see the router at work on simulated engines (a minute)"),
    "bench": ("hiveroute.bench.command", "benchmark routers on agentic, chat and trace workloads"),
    "mcp": ("hiveroute.integrations.mcp_command", "run the MCP server (stdio or streamable HTTP)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hiveroute",
        description="Agent-aware, KV-cache-aware router for vLLM-compatible engines.",
    )
    parser.add_argument("--version", action="version", version=f"hiveroute {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(command_parser)
        # `_parser`: the parser whose usage a mistake is explained with (a nested command,
        # such as `bench run`, sets its own)
        command_parser.set_defaults(_run=module.run, _parser=command_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would blame the top-level parser and print its usage
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args._run(args))
    except ConfigError as exc:
        print(f"hiveroute {args.command}: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
