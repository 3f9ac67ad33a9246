"""The router's instructions per request, counted by valgrind: a CPU figure a noisy machine
cannot move.

    python -m benchmarks.router_instructions [--targets hiveroute:workflow,base:workflow]
        [--base DIR] [--words 4000] [--requests 1000] [--reps 1]

CPU seconds per request (`router_cpu`) swing by a fifth between runs on a shared machine, more
than most changes to the hot path are worth. Instructions do not: each target runs under
`valgrind --tool=callgrind` (about fifty times slower, which only the router notices), serves a
warm-up of `--warmup` requests, has its counters zeroed (`callgrind_control -z`), serves
`--requests` more from 32 closed-loop clients (as in `router_cpu`: the same agentic chat bodies,
two instant engines, the router pinned to core 1), and has them dumped. Instructions over the
requests answered is the figure; it counts the garbage collector's passes too, but not cache
misses, so a change that only moves memory around reads as no change here. Work on a timer
(the health round, here once an hour) would be fifty times its share under valgrind, so
it is kept out. A saturated router under valgrind has a steady number of requests in flight,
so the collector's young passes, which run as that number grows, are rare here: read the
collector's cost off `router_cpu` with its passes counted, not off this.

Targets: `hiveroute:POLICY` (this checkout), `base:POLICY` (the checkout in `--base`: before and
after in one run), `aiohttp-relay` (benchmarks.aiohttp_relay, the HTTP stack alone), and the
peers `smg`, `sglang` (their Rust binaries count the same way). Writes
benchmarks/results/NAME.{md,json} (`--name`, default router_instructions).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.agentic_bodies import agentic_bodies
from benchmarks.cli import comma_list
from benchmarks.instant_engine import peer_command, pin, start, stop_all, wait_http
from benchmarks.report import publish
from benchmarks.router_cpu import start_engines
from hiveroute import runtime
from hiveroute.runtime import free_port

CLIENTS = 32
TITLE = "Router instructions per request (valgrind callgrind)"


async def send_requests(
    url: str, bodies: list[tuple[bytes, dict[str, str]]], count: int
) -> tuple[int, int]:
    """`count` requests from CLIENTS closed-loop clients; (answered 200, failed)."""
    issued = ok = failed = 0
    timeout = aiohttp.ClientTimeout(total=600)  # a router under valgrind is slow, not stuck
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def client() -> None:
            nonlocal issued, ok, failed
            while issued < count:
                body, headers = bodies[issued % len(bodies)]
                issued += 1
                try:
                    async with http.post(
                        f"{url}/v1/chat/completions", data=body, headers=headers, timeout=timeout
                    ) as answer:
                        await answer.read()
                        ok += answer.status == 200
                        failed += answer.status != 200
                except aiohttp.ClientError:
                    failed += 1

        await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return ok, failed


def router_command(target: str, engines: list[str], port: int) -> list[str]:
    """The command of an aiohttp relay or a hiveroute router (this checkout's or, with
    PYTHONPATH set to it, the base's)."""
    kind, _, policy = target.partition(":")
    urls = [e.split(",")[0] for e in engines]
    if kind == "aiohttp-relay":
        cmd = [sys.executable, "-m", "benchmarks.aiohttp_relay", str(port)]
        return cmd + [a for u in urls for a in ("--engine", u)]
    cmd = [sys.executable, "-m", "hiveroute", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--policy", policy, "--log-level", "warning", "--health-interval-s", "3600",
           "--keep-warm-interval-s", "0", "--workers", "1"]  # fmt: skip
    return cmd + [a for e in engines for a in ("--engine", e)]


def instructions(dump: Path) -> int:
    """The total instructions (Ir) of a callgrind dump."""
    found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.M)
    if found is None:
        raise RuntimeError(f"no instruction total in {dump}")
    return int(found.group(1))


async def measure(
    target: str, engines: list[str], args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    """One target under callgrind: instructions per request over `args.requests`."""
    tag = target.replace(":", "-")
    out = logs / f"{tag}.callgrind"
    for old in glob.glob(f"{out}*"):
        Path(old).unlink()
    port = free_port()
    if target in ("smg", "sglang"):
        urls = [e.split(",")[0] for e in engines]
        inner = await peer_command(target, urls, port, None, logs)
        env = cwd = None
    else:
        inner = router_command(target, engines, port)
        cwd = str(Path(args.base).resolve()) if target.startswith("base:") else None
        env = {"PYTHONPATH": cwd} if cwd else None
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no"]
    proc = start([*valgrind, *inner], (1,), logs / f"{tag}.log", env, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_http(f"{url}/health", timeout_s=600)
        bodies = agentic_bodies(args.words, 256)
        await send_requests(url, bodies, args.warmup)
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
        started = time.perf_counter()
        ok, failed = await send_requests(url, bodies, args.requests)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
        elapsed = time.perf_counter() - started
    finally:
        stop_all([proc], timeout_s=120)
    dumps = sorted(Path(p) for p in glob.glob(f"{out}.*"))
    total = sum(instructions(d) for d in dumps if d.stat().st_size > 0)
    return {
        "target": target,
        "answered": ok,
        "failed": failed,
        "instructions_per_request": total / ok if ok else float("nan"),
        "seconds_under_valgrind": round(elapsed, 1),
    }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    pin(0)
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    engines, engine_procs = await start_engines("instant", logs)
    results = []
    try:
        for rep in range(args.reps):
            for target in args.targets:
                row = await measure(target, engines, args, logs)
                row["rep"] = rep
                results.append(row)
                print(
                    f"rep {rep} {target:24s} {row['instructions_per_request'] / 1e6:7.3f} "
                    f"M instructions/request  ({row['answered']} answered, {row['failed']} failed, "
                    f"{row['seconds_under_valgrind']} s)",
                    flush=True,
                )
    finally:
        stop_all(engine_procs)
    return results


def report(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    lines = [
        f"- {args.requests} requests counted after {args.warmup} of warm-up, {CLIENTS} closed-loop "
        f"clients, {args.words}-word agentic chat bodies, two instant engines",
    ]
    if args.base:
        lines.append(f"- `base:POLICY`: hiveroute from {args.base}")
    lines += ["", "| target | M instructions / request | reps |", "|---|---:|---|"]
    for target in args.targets:
        values = [r["instructions_per_request"] / 1e6 for r in results if r["target"] == target]
        reps = ", ".join(f"{v:.3f}" for v in values)
        lines.append(f"| {target} | {statistics.median(values):.3f} | {reps} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--targets", type=comma_list, default="hiveroute:round_robin,hiveroute:workflow"
    )
    parser.add_argument("--base", help="another checkout, for base:POLICY targets")
    parser.add_argument("--words", type=int, default=4000)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--name", default="router_instructions")
    parser.add_argument("--log-dir", default="/tmp/hiveroute-router-instructions")
    args = parser.parse_args()
    if any(t.startswith("base:") for t in args.targets) and not args.base:
        parser.error("base:POLICY targets need --base DIR")
    runtime.use_fastest_event_loop()
    results = asyncio.run(run(args))
    publish(args.name, TITLE, report(args, results), results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
