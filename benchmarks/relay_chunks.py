"""What relaying one streamed token costs a router, when tokens arrive as an engine decodes them.

    python -m benchmarks.relay_chunks [--targets hiveroute:round_robin,aiohttp-relay,splice-relay,smg]
        [--chunks 96] [--gap-ms 2] [--clients 16] [--seconds 6] [--reps 3]

Why: a matrix run's answers are streams of about 50-100 tokens, and each token reaches the router
alone, a decode step after the last (in ag-f8-c4k-g5-context one worker received 95 HTTP chunks a
request). A router therefore pays per token: a wake-up, a read, its HTTP client's parsing, a
write. The router benchmarks' instant engines send their chunks back to back, so they arrive
together and hide that cost.

For each target and repetition: an instant engine (benchmarks.instant_engine) that answers every
stream with 1 chunk, then one that answers with `--chunks` chunks `--gap-ms` apart; the target in
front of it, alone on core 1 (hiveroute at `--workers 1`), the engine and this load generator on
core 0; `--clients` closed-loop streaming clients for `--seconds`. The router's CPU per request
at both, and their difference over `chunks - 1`: its CPU per relayed chunk. Targets take turns
within each repetition; medians of `--reps`. Writes benchmarks/results/NAME.{md,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.cli import comma_list
from benchmarks.instant_engine import pin, start_engine, stop_all, wait_http
from benchmarks.report import publish
from benchmarks.router_cpu import TARGETS, Running, hiveroute_has_workers, start_target
from hiveroute import runtime
from hiveroute.runtime import free_port

BODY = b'{"model":"m","messages":[{"role":"user","content":"hello"}],"stream":true}'
HEADERS = {"Content-Type": "application/json"}


async def stream_loop(url: str, clients: int, seconds: float, running: Running) -> dict[str, Any]:
    """`clients` clients streaming answers to the end for `seconds` after a warm-up; the
    router's CPU ms per request, less what it spends idle in as long."""
    done = errors = 0
    measuring = False
    stop_at = 0.0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def client() -> None:
            nonlocal done, errors
            while time.perf_counter() < stop_at:
                try:
                    async with http.post(
                        f"{url}/v1/chat/completions", data=BODY, headers=HEADERS
                    ) as r:
                        body = await r.read()
                        ok = r.status == 200 and body.endswith(b"data: [DONE]\n\n")
                except aiohttp.ClientError:
                    ok = False
                if measuring:
                    done += ok
                    errors += not ok

        stop_at = time.perf_counter() + max(1.0, seconds / 4)  # warm-up
        await asyncio.gather(*(client() for _ in range(clients)))
        measuring = True
        cpu0, t0 = running.cpu(), time.perf_counter()
        stop_at = t0 + seconds
        await asyncio.gather(*(client() for _ in range(clients)))
        cpu, elapsed = running.cpu() - cpu0, time.perf_counter() - t0
    # what the router spends idle (health checks, timers) is paid per second, not per request:
    # a run of long streams answers fewer requests in the same time, and would count it per
    # chunk, so it is measured alone after the load and taken out
    await asyncio.sleep(1.0)
    idle0 = running.cpu()
    await asyncio.sleep(seconds)
    idle_per_s = (running.cpu() - idle0) / seconds
    net = cpu - idle_per_s * elapsed
    return {
        "requests": done,
        "errors": errors,
        "idle_ms_per_s": idle_per_s * 1000,
        "cpu_ms_per_req": net * 1000 / done if done else float("nan"),
    }


async def measure(args: argparse.Namespace, logs: Path) -> list[dict[str, Any]]:
    pin(0)
    has_workers = hiveroute_has_workers()
    rows: list[dict[str, Any]] = []
    for rep in range(args.reps):
        order = args.targets if rep % 2 == 0 else args.targets[::-1]
        for name in order:
            for chunks in (1, args.chunks):
                port = free_port()
                engine = start_engine(port, chunks, (0,), logs / "engine.log", args.gap_ms)
                procs = [engine]
                try:
                    await wait_http(f"http://127.0.0.1:{port}/health")
                    running = await start_target(
                        TARGETS[name], [f"http://127.0.0.1:{port}"], 1, logs, has_workers
                    )
                    procs += running.procs
                    result = await stream_loop(running.urls[0], args.clients, args.seconds, running)
                finally:
                    stop_all(procs)
                row = {"target": name, "rep": rep, "chunks": chunks, **result}
                rows.append(row)
                print(
                    f"rep {rep} {name:22} {chunks:>4} chunks  {result['cpu_ms_per_req']:.3f} "
                    f"CPU ms/req  {result['requests']} requests  idle "
                    f"{result['idle_ms_per_s']:.1f} ms/s  errors={result['errors']}",
                    file=sys.stderr,
                )
    return rows


def per_chunk(rows: list[dict[str, Any]], name: str, rep: int, chunks: int) -> float:
    """One repetition's CPU µs per relayed chunk: (N chunks - 1 chunk) / (N - 1)."""
    one, many = (
        next(r["cpu_ms_per_req"] for r in rows if (r["target"], r["rep"], r["chunks"]) == key)
        for key in ((name, rep, 1), (name, rep, chunks))
    )
    return (many - one) * 1000 / (chunks - 1)


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"- engine: instant, streams of 1 and of {args.chunks} chunks, {args.gap_ms:g} ms "
        f"apart; {args.clients} closed-loop streaming clients, {args.seconds:g} s measured after "
        f"a warm-up; medians of {args.reps} repetitions, targets by turns",
        "- router alone on core 1 (hiveroute: one worker); engine and load generator on core 0",
        "- CPU per request is net of the router's idle CPU (measured alone for as long after "
        "each run): long streams answer fewer requests in the same time, so idle work would "
        "otherwise count per chunk",
        "",
        f"| target | CPU ms/request, 1 chunk | CPU ms/request, {args.chunks} chunks "
        "| CPU µs per relayed chunk | per rep | errors |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for name in args.targets:
        mine = [r for r in rows if r["target"] == name]
        at = {c: statistics.median(r["cpu_ms_per_req"] for r in mine if r["chunks"] == c)
              for c in (1, args.chunks)}  # fmt: skip
        each = [per_chunk(rows, name, rep, args.chunks) for rep in range(args.reps)]
        lines.append(
            f"| {name} | {at[1]:.3f} | {at[args.chunks]:.3f} | {statistics.median(each):.1f} | "
            f"{', '.join(f'{v:.1f}' for v in each)} | {sum(r['errors'] for r in mine)} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--targets", type=comma_list,
                        default="hiveroute:round_robin,aiohttp-relay,splice-relay,smg")  # fmt: skip
    parser.add_argument("--chunks", type=int, default=96, help="chunks per long stream (> 1)")
    parser.add_argument("--gap-ms", type=float, default=2.0, help="pause between a stream's chunks")
    parser.add_argument("--clients", type=int, default=16, help="closed-loop streaming clients")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per run")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument(
        "--name", default="relay_chunks", help="report name under benchmarks/results"
    )
    parser.add_argument("--log-dir", default="/tmp/hiveroute-relay-chunks")
    args = parser.parse_args()
    unknown = [t for t in args.targets if t not in TARGETS or t == "direct"]
    if unknown or args.chunks < 2:
        parser.error(f"unknown targets {unknown}" if unknown else "--chunks must be at least 2")
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    rows = runtime.run(measure(args, logs))
    title = "Router CPU per relayed stream chunk, tokens arriving as an engine decodes them"
    publish(args.name, title, report(args, rows), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
