"""Cache-aware routing on simulated engines: hit rate and TTFT per policy, and an ideal cache.

Runs the bench harness (`hiveroute bench compare`) twice:

1. every policy (round_robin, least_load, session, prefix, kv) in front of its own N simulated
   engines, on the Mooncake conversation trace (../shared/data/mooncake) and a multi-turn
   workload;
2. the ideal: one engine whose KV cache is as large as the N engines' together and which runs N
   times faster (every prefix is found wherever it was computed; its hit rate is the reference).

    PYTHONPATH=. python -m benchmarks.kv_routing [--engines 4] [--trace-limit 1000] [...]

Extra arguments after `--` go to the harness (e.g. `-- --users 32`). Peer routers (SGLang,
vLLM's) are added with `--peers`, which the bench harness installs on first use.

Every router runs in its own process (`hiveroute serve`, like the peers), not in the load
generator's: in-process, the cache-aware policies' work (tokenizing, matching, KV events)
delayed the generator's sends (p99 77-121 ms late on the trace against 4 ms for the other
targets, 2026-12-01), bunching arrivals into bursts that only the hiveroute targets saw.
`--in-process` runs them in the harness's process anyway (for profiling).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.cli import comma_list
from benchmarks.report import write_report

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared/data/mooncake/conversation_trace.jsonl"
POLICIES = ("round_robin", "least_load", "session", "prefix", "kv")
PEERS = ("sglang:cache_aware", "vllm-router:cache_aware")


def _harness_argv(
    args: argparse.Namespace, targets: list[str], engines: int, blocks: int
) -> list[str]:
    argv = ["compare", "--quiet", "--out", str(args.out), "--name", "kv-routing"]
    for target in targets:
        argv += ["--target", target]
    for workload in args.workload:
        argv += ["--workload", workload]
    argv += ["--engines", "sim", "--num-engines", str(engines), "--preset", args.preset]
    argv += ["--block-size", str(args.block_size), "--sim-option", f"num_blocks={blocks}"]
    argv += ["--slices", str(args.slices), "--seed", str(args.seed)]
    argv += ["--trace", str(args.trace)]
    argv += ["--trace-limit", str(args.trace_limit), "--trace-skip", str(args.trace_skip)]
    argv += ["--trace-speed", str(args.trace_speed)]
    argv += ["--token-scale", str(args.token_scale), "--max-output-tokens", str(args.max_output)]
    argv += ["--users", str(args.users), "--turns", str(args.turns)]
    argv += ["--session-rate", str(args.session_rate), "--history-tokens", str(args.history_tokens)]
    argv += ["--answer-tokens", str(args.answer_tokens)]
    return [*argv, *args.rest]


def _run(argv: list[str]) -> list[dict[str, Any]]:
    from hiveroute.bench.command import configure, execute, options_from_args

    parser = argparse.ArgumentParser(prog="hiveroute bench")
    configure(parser)
    parsed = parser.parse_args(argv)
    return list(execute(options_from_args(parsed, ["hiveroute", "bench", *argv])).cells)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: Any) -> str:
    return "-" if value is None else f"{1000 * value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=12000, help="KV blocks per engine")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--preset", default="llama-8b-h100")
    parser.add_argument("--workload", action="append", choices=("trace", "multiturn"))
    parser.add_argument("--trace", type=Path, default=TRACE, help="Mooncake trace (JSONL)")
    parser.add_argument("--trace-limit", type=int, default=1500)
    parser.add_argument(
        "--trace-skip", type=int, default=0, help="replay the trace from this row (a later slice)"
    )
    parser.add_argument("--trace-speed", type=float, default=10.0)
    parser.add_argument("--token-scale", type=float, default=0.1)
    parser.add_argument("--max-output", type=int, default=32)
    # multi-turn under cache pressure: 128 users with 8k-token histories arriving at 4/s hold
    # more KV than one engine has, so where each session starts decides whether caches thrash
    parser.add_argument("--users", type=int, default=128)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--session-rate", type=float, default=4.0, help="sessions per second")
    parser.add_argument("--history-tokens", type=int, default=8192)
    parser.add_argument("--answer-tokens", type=int, default=32, help="tokens per reply")
    parser.add_argument("--slices", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peers", action="store_true", help="also SGLang's and vLLM's routers")
    parser.add_argument("--no-ideal", action="store_true")
    parser.add_argument(
        "--policies",
        type=comma_list,
        default=",".join(POLICIES),
        help="comma-separated hiveroute policies",
    )
    parser.add_argument(
        "--in-process", action="store_true", help="hiveroute in the harness's process (profiling)"
    )
    parser.add_argument("--no-write", dest="write", action="store_false", help="only print")
    parser.add_argument("--out", type=Path, default=Path("runs"))
    parser.add_argument("rest", nargs="*", help="after --: more harness arguments")
    args = parser.parse_args()
    args.workload = args.workload or ["trace", "multiturn"]

    kind = "hiveroute-inproc" if args.in_process else "hiveroute"
    targets = [f"{kind}:{p}" for p in args.policies] + (list(PEERS) if args.peers else [])
    cells = _run(_harness_argv(args, targets, args.engines, args.blocks))
    if not args.no_ideal:
        # one engine with the fleet's KV cache and its compute too (it runs N x faster), so
        # that it is not overloaded: an overloaded engine's queue changes what stays cached
        fast = ["--sim-option", f"time_scale={1 / args.engines}"]
        ideal = _run(_harness_argv(args, ["engine"], 1, args.blocks * args.engines) + fast)
        cells += [{**c, "target": "ideal (one cache, same total size)"} for c in ideal]

    lines = [
        f"{args.engines} simulated engines ({args.preset}, {args.blocks} blocks of "
        f"{args.block_size} tokens each); ideal = 1 engine with {args.engines * args.blocks} blocks, "
        f"{args.engines}x faster",
        "",
        "| workload | target | requests | hit rate | TTFT p50 ms | TTFT p99 ms |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for c in sorted(cells, key=lambda c: (c["workload"], c["target"])):
        lines.append(
            f"| {c['workload']} | {c['target']} | {c['ok']}/{c['requests']} | "
            f"{_pct(c['hit_rate'])} | {_ms(c['ttft_s_p50'])} | {_ms(c['ttft_s_p99'])} |"
        )
    lines.append("")
    for workload in args.workload:
        row = {c["target"]: c for c in cells if c["workload"] == workload}
        kv, best = row.get(f"{kind}:kv"), row.get("ideal (one cache, same total size)")
        if kv and best and kv["hit_rate"] is not None and best["hit_rate"]:
            lines.append(
                f"{workload}: kv reaches {kv['hit_rate'] / best['hit_rate']:.0%} of the ideal "
                "cache's hit rate"
            )
    table = "\n".join(lines)
    print(table)
    if args.write:
        path = write_report("kv_routing", "Cache-aware routing (prefix, kv) vs. the rest", table)
        print(f"report: {path}")


if __name__ == "__main__":
    sys.exit(main())
