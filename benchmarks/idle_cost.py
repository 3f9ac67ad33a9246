"""What a router costs when no request arrives: its background work, on it and on the engines.

    python -m benchmarks.idle_cost --base DIR [--new DIR] [--engines 4] [--workers 2]
        [--seconds 20] [--reps 4] [--name idle_cost]

Health checks, KV-event subscribers and the router's own probes run whether requests come or
not; on a host whose cores also run engines, their CPU is taken from the requests. Two
checkouts (`git archive` of each commit) are run by turns (base, new; then new, base) in front of
the same simulated engines (`hiveroute sim --preset llama-8b-h100`, KV events on): each starts
as `hiveroute serve --workers N` with its defaults, is left idle for a warm-up, then for
`--seconds` during which the CPU seconds of the router's processes and of the simulator's are
read from /proc. Prints each repetition and the medians; writes benchmarks/results/NAME.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from benchmarks.instant_engine import start, stop_all, wait_http
from benchmarks.report import publish
from hiveroute.bench.engines import EngineOptions, Fleet, start_fleet
from hiveroute.bench.procs import tree_cpu_seconds
from hiveroute.runtime import free_port

ROOT = Path(__file__).resolve().parent.parent
WARM_UP_S = 5.0


async def idle_cpu(
    source: str, fleet: Fleet, workers: int, seconds: float, log: Path
) -> tuple[float, float]:
    """CPU ms per second of the router's processes and of the simulator's, while idle."""
    port = free_port()
    cmd = [sys.executable, "-m", "hiveroute", "serve", "--port", str(port), "--host", "127.0.0.1",
           "--workers", str(workers), "--log-level", "warning",
           *(a for spec in fleet.specs for a in ("--engine", spec))]  # fmt: skip
    proc = start(cmd, (0, 1), log, {"PYTHONPATH": source}, cwd=source)
    try:
        await wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120)
        await asyncio.sleep(WARM_UP_S)
        router0, sim0, t0 = tree_cpu_seconds(proc.pid), fleet.cpu_seconds(), time.monotonic()
        await asyncio.sleep(seconds)
        router1, sim1, t1 = tree_cpu_seconds(proc.pid), fleet.cpu_seconds(), time.monotonic()
    finally:
        stop_all([proc])
    if router0 is None or router1 is None or sim0 is None or sim1 is None:
        raise RuntimeError("no /proc figures: this benchmark needs Linux")
    span = t1 - t0
    return (router1 - router0) / span * 1e3, (sim1 - sim0) / span * 1e3


async def main_async(args: argparse.Namespace) -> int:
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    sources = {"base": str(Path(args.base).resolve()), "new": str(Path(args.new).resolve())}
    fleet = await start_fleet(EngineOptions(count=args.engines), logs / "sim.log")
    figures: dict[str, dict[str, list[float]]] = {
        name: {"router": [], "sim": []} for name in sources
    }
    try:
        for rep in range(args.reps):
            for name in ("base", "new") if rep % 2 == 0 else ("new", "base"):
                log = logs / f"{name}-{rep}.log"
                router, engines = await idle_cpu(
                    sources[name], fleet, args.workers, args.seconds, log
                )
                figures[name]["router"].append(router)
                figures[name]["sim"].append(engines)
                print(f"rep {rep} {name}: router {router:.1f} ms/s, engines {engines:.1f} ms/s")
    finally:
        await fleet.stop()
    write_report(args, figures)
    return 0


def write_report(args: argparse.Namespace, figures: dict[str, dict[str, list[float]]]) -> None:
    lines = [
        f"- base: {args.base_label or args.base}; new: {args.new_label or args.new}",
        f"- {args.engines} simulated engines (llama-8b-h100, KV events on), "
        f"`serve --workers {args.workers}` at its defaults, {WARM_UP_S:.0f} s warm-up, "
        f"{args.seconds:.0f} s measured, {args.reps} repetitions by turns",
        "",
        "| checkout | router CPU ms/s (median) | engines' CPU ms/s (median) | router, each rep | "
        "engines, each rep |",
        "|---|---:|---:|---|---|",
    ]
    for name in ("base", "new"):
        router, engines = figures[name]["router"], figures[name]["sim"]
        lines.append(
            f"| {name} | {statistics.median(router):.1f} | {statistics.median(engines):.1f} | "
            f"{', '.join(f'{v:.1f}' for v in router)} | {', '.join(f'{v:.1f}' for v in engines)} |"
        )
    publish(args.name, "CPU of an idle router and of its engines", "\n".join(lines), figures)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the baseline checkout (git archive)")
    parser.add_argument("--new", default=str(ROOT), help="the checkout to compare (this one)")
    parser.add_argument("--base-label", default="", help="what the base is (its commit)")
    parser.add_argument("--new-label", default="", help="what the new one is (its commit)")
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--name", default="idle_cost")
    parser.add_argument("--log-dir", default="/tmp/hiveroute-idle-cost")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
