"""Two hiveroute checkouts' CPU per request, interleaved: an A/B that survives a noisy machine.

    python -m benchmarks.router_cpu_ab --base DIR [--new DIR] [--policy workflow]
        [--words 4000] [--engines instant|sim] [--reps 8]

`router_cpu --baseline` runs the baseline first in every repetition; on a shared machine a
drift of the load then reads as a difference between the two. Here each repetition alternates
the order (base, new; then new, base), on the same engines and bodies as `router_cpu` (32
closed-loop clients, the router pinned to core 1). Prints each repetition and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

from benchmarks.agentic_bodies import agentic_bodies
from benchmarks.instant_engine import pin, stop_all
from benchmarks.router_cpu import Target, closed_loop, start_engines, start_target

ROOT = Path(__file__).resolve().parents[1]


async def interleaved(args: argparse.Namespace) -> dict[str, list[float]]:
    pin(0)
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    targets = {
        "base": Target("base", "hiveroute", args.policy, str(Path(args.base).resolve())),
        "new": Target("new", "hiveroute", args.policy, str(Path(args.new).resolve())),
    }
    engines, engine_procs = await start_engines(args.engines, logs)
    bodies = agentic_bodies(args.words, 256)
    cpu: dict[str, list[float]] = {"base": [], "new": []}
    try:
        for rep in range(args.reps):
            for name in ("base", "new") if rep % 2 == 0 else ("new", "base"):
                running = await start_target(targets[name], engines, 1, logs, False)
                try:
                    result = await closed_loop(running.urls, bodies, 32, args.seconds, running)
                finally:
                    stop_all(running.procs)
                cpu[name].append(result["cpu_ms_per_req"])
            print(f"rep {rep}: base {cpu['base'][-1]:.3f}  new {cpu['new'][-1]:.3f} CPU ms/req")
    finally:
        stop_all(engine_procs)
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the baseline checkout (git archive)")
    parser.add_argument("--new", default=str(ROOT), help="the checkout to compare (this one)")
    parser.add_argument("--policy", default="workflow")
    parser.add_argument("--words", type=int, default=4000, help="body size in words")
    parser.add_argument("--engines", choices=("instant", "sim"), default="instant")
    parser.add_argument("--reps", type=int, default=8, help="repetitions (order alternates)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per run")
    parser.add_argument("--log-dir", default="/tmp/hiveroute-router-cpu-ab")
    args = parser.parse_args()
    if args.reps < 2:
        parser.error("--reps must be at least 2 (the order alternates)")
    cpu = asyncio.run(interleaved(args))
    for name, values in cpu.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name}: median {statistics.median(values):.3f} CPU ms/req ({shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
