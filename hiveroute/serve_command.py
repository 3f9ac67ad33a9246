"""`hiveroute serve`."""

from __future__ import annotations

import argparse
import sys

from hiveroute import runtime
from hiveroute.assembly import check_config
from hiveroute.config import RouterConfig, add_config_arguments, load_config
from hiveroute.gateway.access_log import configure_logging
from hiveroute.server import serve
from hiveroute.workers import serve_workers


def configure(parser: argparse.ArgumentParser) -> None:
    from hiveroute.routing.registry import policy_names

    # the full list of flags is in --help; a mistake shows this line and the error
    parser.usage = "hiveroute serve [--engine URL[,events=tcp://H:P] ...] [--policy NAME] [--config FILE] [OPTION ...]"
    notes = {"policy": f"{', '.join(policy_names())}, or one defined under `policies`"}
    add_config_arguments(parser, RouterConfig, notes)


def run(args: argparse.Namespace) -> int:
    config: RouterConfig = load_config(args, cls=RouterConfig)
    check_config(config)  # before any engine starts
    configure_logging(config.log_level)
    try:
        runtime.run(serve(config, serve_workers=serve_workers))
    except OSError as exc:
        print(f"hiveroute serve: {exc}", file=sys.stderr)
        return 1
    return 0
