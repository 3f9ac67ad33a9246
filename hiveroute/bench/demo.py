"""`hiveroute demo`: the first thing to run on a fresh machine.

Starts simulated engines (a preset where prefill costs real time) and the router twice, once
with round-robin and once with the most capable policy this build has, runs the same short
agentic workload through each, prints the comparison and where the full report is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hiveroute.bench.command import execute, options_from_args
from hiveroute.bench.targets import best_policy
from hiveroute.bench.workloads.base import positive_int


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("runs"), help="where the report goes")
    parser.add_argument(
        "--num-engines", type=positive_int, default=4, help="simulated engines behind each router"
    )
    parser.add_argument(
        "--workflows",
        type=positive_int,
        default=12,
        help="agentic workflows run through each router",
    )
    parser.add_argument("--preset", default="llama-8b-h100", help="simulator preset")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from hiveroute.cli import build_parser

    best = best_policy()
    argv = [
        "bench",
        "compare",
        "--target",
        "hiveroute:round_robin",
        "--target",
        f"hiveroute:{best}",
        "--workload",
        "agentic",
        "--slices",
        "1",
        "--name",
        "demo",
        "--out",
        str(args.out),
        "--num-engines",
        str(args.num_engines),
        "--preset",
        args.preset,
        "--workflows",
        str(args.workflows),
        "--workflow-rate",
        "1.5",
        "--rounds",
        "2",
        "--fan-out",
        "3",
        "--kb-tokens",
        "6144",
        "--tool-gap",
        "exp:0.3",
        "--duration",
        "60",
    ]
    if args.quiet:
        argv.append("--quiet")
    bench_args = build_parser().parse_args(argv)
    print(
        f"hiveroute demo: {args.num_engines} simulated engines ({args.preset}) per router; "
        f"{args.workflows} agentic workflows through round_robin, then {best}",
        file=sys.stderr,
    )
    options = options_from_args(bench_args, ["hiveroute", "demo", *sys.argv[2:]])
    try:
        result = execute(options)
    except RuntimeError as exc:
        print(f"hiveroute demo: {exc}", file=sys.stderr)
        return 1
    print()
    print(result.table)
    by_target = {c["target"]: c for c in result.cells}
    base, opt = by_target.get("hiveroute:round_robin"), by_target.get(f"hiveroute:{best}")
    if base and opt:
        print(f"\n{best} against round_robin, same workflows on the same kind of engines:")
        for key, title, scale, unit in (
            ("ttft_s_p50", "TTFT p50", 1000, "ms"),
            ("ttft_s_p90", "TTFT p90", 1000, "ms"),
            ("unit_s_p50", "workflow time p50", 1, "s"),
            ("hit_rate", "prefix-cache hit rate", 100, "%"),
        ):
            if base.get(key) is not None and opt.get(key) is not None:
                print(
                    f"  {title:<22} {base[key] * scale:8.1f} {unit:<2} -> "
                    f"{opt[key] * scale:8.1f} {unit}"
                )
    print(f"\nreport: {result.run_dir / 'report.md'}")
    return 0
