"""The workloads, by name. Each module has `add_arguments(parser)` and
`from_args(args, seed, namespace) -> Workload`."""

from __future__ import annotations

import argparse
from types import ModuleType

from hiveroute.bench.workloads import agentic, agentloop, multiturn, trace
from hiveroute.bench.workloads.base import Workload

WORKLOADS: dict[str, ModuleType] = {
    "agentic": agentic,
    "agentloop": agentloop,
    "multiturn": multiturn,
    "trace": trace,
}


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    for module in WORKLOADS.values():
        module.add_arguments(parser)


def build_workload(name: str, args: argparse.Namespace, seed: int, namespace: str) -> Workload:
    workload: Workload = WORKLOADS[name].from_args(args, seed, namespace)
    return workload
