"""What the cyclic garbage collector costs a loaded router: its passes, their time and the CPU
per request, for this checkout and a baseline, interleaved.

    python -m benchmarks.router_gc --base DIR [--policy workflow] [--words 4000] [--reps 6]

Each repetition runs both checkouts in turn (the order alternates), on the same two instant
engines and agentic chat bodies as `router_cpu` (32 closed-loop clients, the router pinned to
core 1). The router runs with a `sitecustomize` (written to a temporary directory and put on
its PYTHONPATH) that times every collector pass with `gc.callbacks` and writes, at exit, the
passes and their time per generation and the process's CPU time. Prints and writes
benchmarks/results/NAME.md (`--name`, default router_cpu_gc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.agentic_bodies import agentic_bodies
from benchmarks.instant_engine import pin, start, stop_all, wait_http
from benchmarks.report import publish
from benchmarks.router_cpu import Running, closed_loop, start_engines
from hiveroute import runtime
from hiveroute.runtime import free_port

ROOT = Path(__file__).resolve().parent.parent

SITECUSTOMIZE = """
import atexit, gc, json, os, time
_started = [0.0]
_passes = [0, 0, 0]
_seconds = [0.0, 0.0, 0.0]
_longest = [0.0, 0.0, 0.0]

def _timed(phase, info):
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    took, generation = time.perf_counter() - _started[0], info["generation"]
    _passes[generation] += 1
    _seconds[generation] += took
    _longest[generation] = max(_longest[generation], took)

def _write():
    with open(os.environ["ROUTER_GC_OUT"], "w") as out:
        json.dump({"passes": _passes, "seconds": _seconds, "longest_s": _longest,
                   "threshold": gc.get_threshold(), "cpu_s": time.process_time()}, out)

gc.callbacks.append(_timed)
atexit.register(_write)
"""


async def run_once(
    source: str, args: argparse.Namespace, engines: list[str], site: Path, logs: Path, tag: str
) -> dict[str, Any]:
    port = free_port()
    out = logs / f"{tag}.json"
    cmd = [sys.executable, "-m", "hiveroute", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--policy", args.policy, "--log-level", "warning", "--health-interval-s", "5",
           "--keep-warm-interval-s", "0", "--workers", "1"]  # fmt: skip
    cmd += [a for e in engines for a in ("--engine", e)]
    env = {"PYTHONPATH": os.pathsep.join([str(site), source]), "ROUTER_GC_OUT": str(out)}
    proc = start(cmd, (1,), logs / f"{tag}.log", env, cwd=source)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_http(f"{url}/health", timeout_s=120)
        bodies = agentic_bodies(args.words, 256)
        result = await closed_loop([url], bodies, 32, args.seconds, Running([url], [proc]))
    finally:
        stop_all([proc], timeout_s=60)
    gc_stats = json.loads(out.read_text())
    return {**result, "gc": gc_stats}


async def run(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    pin(0)
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    sources = {"base": str(Path(args.base).resolve()), "new": str(ROOT)}
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    engines, engine_procs = await start_engines("instant", logs)
    with tempfile.TemporaryDirectory() as site:
        (Path(site) / "sitecustomize.py").write_text(SITECUSTOMIZE)
        try:
            for rep in range(args.reps):
                for name in ("base", "new") if rep % 2 == 0 else ("new", "base"):
                    row = await run_once(
                        sources[name], args, engines, Path(site), logs, f"{name}-{rep}"
                    )
                    runs[name].append(row)
                    gc_s = sum(row["gc"]["seconds"])
                    print(
                        f"rep {rep} {name}: {row['cpu_ms_per_req']:.3f} CPU ms/req, "
                        f"collector {gc_s:.2f} s of {row['gc']['cpu_s']:.1f} s CPU, "
                        f"passes {row['gc']['passes']}",
                        flush=True,
                    )
        finally:
            stop_all(engine_procs)
    return runs


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        f"- `{args.policy}`, {args.words}-word agentic chat bodies, 32 closed-loop clients, two "
        f"instant engines, {args.seconds} s measured per run after a warm-up; base = {args.base}",
        "- the collector's share: its passes' time (gc.callbacks) over the process's CPU time, "
        "for the router's whole life (start-up, warm-up and the measured stretch)",
        "",
        "| checkout | CPU ms/req (median) | collector share of CPU | passes gen0 / gen1 / gen2 "
        "(median) | longest pass ms | threshold |",
        "|---|---:|---:|---|---:|---|",
    ]
    for name, rows in runs.items():
        cpu = statistics.median(r["cpu_ms_per_req"] for r in rows)
        share = statistics.median(sum(r["gc"]["seconds"]) / r["gc"]["cpu_s"] for r in rows)
        passes = [int(statistics.median(r["gc"]["passes"][g] for r in rows)) for g in range(3)]
        longest = max(max(r["gc"]["longest_s"]) for r in rows) * 1000
        threshold = tuple(rows[0]["gc"]["threshold"])
        lines.append(
            f"| {name} | {cpu:.3f} | {100 * share:.1f} % | {' / '.join(map(str, passes))} | "
            f"{longest:.1f} | {threshold} |"
        )
    lines += ["", "CPU ms/req per repetition:", ""]
    for name, rows in runs.items():
        lines.append(f"- {name}: " + ", ".join(f"{r['cpu_ms_per_req']:.3f}" for r in rows))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the baseline checkout (git archive)")
    parser.add_argument("--policy", default="workflow")
    parser.add_argument("--words", type=int, default=4000)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--name", default="router_cpu_gc")
    parser.add_argument("--log-dir", default="/tmp/hiveroute-router-gc")
    args = parser.parse_args()
    runtime.use_fastest_event_loop()
    runs = asyncio.run(run(args))
    publish(args.name, "The garbage collector in a loaded router", report(args, runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
