"""What the router adds: the same requests sent to an engine directly and through routers.

    python -m benchmarks.gateway_overhead [--quick] [--peers sglang,smg] [--bodies tiny,agentic]

The engine is a minimal OpenAI-shaped server (instant answers, or a stream of N chunks), so
what is measured is the router, not a model. Pinned to cores where the machine has two: the
router under test gets core 1 alone ("on one core"); the engine and this load generator share
core 0. Targets are interleaved per (mode, concurrency) cell, so a noisy neighbour hits all of
them alike. hiveroute is measured at `round_robin` with a 2-token prompt (the router's floor)
and at its default policy `workflow` (and `round_robin`) with 4,000-word agentic bodies. Prints
a table and writes benchmarks/results/gateway_overhead.{md,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.agentic_bodies import agentic_bodies
from benchmarks.cli import comma_list
from benchmarks.instant_engine import (
    peer_command,
    pin,
    start,
    start_engine,
    stop_all,
    wait_http,
)
from hiveroute import runtime
from hiveroute.runtime import free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


async def peer_router(name: str, engine_url: str, logs: Path) -> tuple[list[str], str]:
    """A peer router's command and URL, at round_robin as hiveroute's first row."""
    port = free_port()
    cmd = await peer_command(name, [engine_url], port, "round_robin", logs)
    return cmd, f"http://127.0.0.1:{port}"


# --- load -----------------------------------------------------------------------------------


@dataclass
class Cell:
    target: str
    body: str
    mode: str
    concurrency: int
    requests: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    ttfts_ms: list[float] = field(default_factory=list)
    chunks: int = 0
    errors: int = 0

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)
        ttft = sorted(self.ttfts_ms)
        return {
            "target": self.target, "body": self.body, "mode": self.mode,
            "concurrency": self.concurrency, "requests": self.requests, "errors": self.errors,
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            "ttft_p50_ms": pct(ttft, 50) if ttft else None, "ttft_p99_ms": pct(ttft, 99) if ttft else None,
            "req_per_s": self.requests / self.seconds, "chunks_per_s": self.chunks / self.seconds,
        }  # fmt: skip


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    index = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[index]


Request = tuple[str, bytes, dict[str, str]]  # path, body, headers


def requests_for(body: str, stream: bool) -> list[Request]:
    """`tiny`: a 2-token completion; `agentic`: 4,000-word agentic chat bodies."""
    if body == "tiny":
        data = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 16, "stream": stream})
        return [("/v1/completions", data.encode(), {"Content-Type": "application/json"})]
    out = []
    for data, headers in agentic_bodies(4000, 64):
        if stream:
            data = data.replace(b'"stream": false', b'"stream": true')
        out.append(("/v1/chat/completions", data, headers))
    return out


async def run_cell(
    url: str, target: str, body: str, mode: str, concurrency: int, total: int
) -> Cell:
    stream = mode == "stream"
    reqs = requests_for(body, stream)
    cell = Cell(target, body, mode, concurrency, total, 0.0)
    remaining = total
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                path, data, headers = reqs[remaining % len(reqs)]
                t0 = time.perf_counter()
                try:
                    async with http.post(f"{url}{path}", data=data, headers=headers) as resp:
                        if stream:
                            first = True
                            async for line in resp.content:
                                if line.startswith(b"data: {"):
                                    if first:
                                        cell.ttfts_ms.append((time.perf_counter() - t0) * 1000)
                                        first = False
                                    cell.chunks += 1
                        else:
                            await resp.read()
                        if resp.status != 200:
                            cell.errors += 1
                except aiohttp.ClientError:
                    cell.errors += 1
                cell.latencies_ms.append((time.perf_counter() - t0) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cell.seconds = time.perf_counter() - started
    return cell


async def main_async(args: argparse.Namespace) -> int:
    pin(0)
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    engine_port = free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    procs = [start_engine(engine_port, args.chunks, (0,), logs / "engine.log")]
    targets = {"direct": engine_url}
    cells: list[Cell] = []
    try:
        await wait_http(f"{engine_url}/health")
        for policy in ("round_robin", "workflow"):
            port = free_port()
            router_cmd = [sys.executable, "-m", "hiveroute", "serve", "--engine", engine_url, "--host", "127.0.0.1",
                          "--port", str(port), "--policy", policy, "--health-interval-s", "5",
                          "--log-level", "warning", "--workers", "1"]  # fmt: skip
            procs.append(start(router_cmd, (1,), logs / f"hiveroute-{policy}.log"))
            targets[f"hiveroute:{policy}"] = f"http://127.0.0.1:{port}"
            await wait_http(f"http://127.0.0.1:{port}/health")
        for peer in args.peers:
            cmd, url = await peer_router(peer, engine_url, logs)
            procs.append(start(cmd, (1,), logs / f"{peer}-router.log"))
            targets[peer] = url
            await wait_http(f"{url}/health", timeout_s=120)
        plan = [(1, args.n1), (64, args.n64), (512, args.n512)]
        for body in args.bodies:
            for mode in ("whole", "stream"):
                for concurrency, total in plan:
                    total = total if body == "tiny" else max(concurrency, total // 4)
                    for target, url in targets.items():  # interleaved: warm-up then measure
                        if body == "tiny" and target == "hiveroute:workflow":
                            continue
                        await run_cell(
                            url, target, body, mode, concurrency, max(concurrency, total // 10)
                        )
                        cell = await run_cell(url, target, body, mode, concurrency, total)
                        cells.append(cell)
                        s = cell.summary()
                        print(f"{body:7} {mode:6} c={concurrency:<4} {target:20} p50={s['p50_ms']:8.3f} ms  p99={s['p99_ms']:8.3f} ms  "
                              f"{s['req_per_s']:9.1f} req/s  {s['chunks_per_s']:10.1f} chunks/s  errors={cell.errors}", file=sys.stderr)  # fmt: skip
    finally:
        stop_all(procs)
    write_report(args, [c.summary() for c in cells], list(targets))
    return 0


def write_report(args: argparse.Namespace, rows: list[dict[str, Any]], targets: list[str]) -> None:
    by = {(r["body"], r["target"], r["mode"], r["concurrency"]): r for r in rows}
    lines = [
        "# Gateway overhead",
        "",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}",
        f"- command: `python -m benchmarks.gateway_overhead {' '.join(shlex.quote(a) for a in sys.argv[1:])}`",
        "- engine: instant OpenAI-shaped server (benchmarks.instant_engine; stream: "
        f"{args.chunks} chunks); routers pinned to core 1, engine and load generator to core 0",
        '- bodies: `tiny` is a 2-token completion (`"prompt": "hello"`); `agentic` are '
        "4,000-word agentic chat bodies (a workflow's shared context + an agent's own message, "
        "benchmarks.agentic_bodies), a quarter as many requests per cell",
        "- peers at `round_robin`",
        "",
        "Added latency is the router's percentile minus the direct percentile in the same cell.",
        "",
        "| body | mode | clients | target | p50 ms | p99 ms | added p50 ms | added p99 ms | TTFT p50 ms | req/s | chunks/s | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for body in args.bodies:
        for mode in ("whole", "stream"):
            for concurrency in (1, 64, 512):
                direct = by.get((body, "direct", mode, concurrency))
                for target in targets:
                    r = by.get((body, target, mode, concurrency))
                    if r is None or direct is None:
                        continue
                    added50 = r["p50_ms"] - direct["p50_ms"]
                    added99 = r["p99_ms"] - direct["p99_ms"]
                    ttft = f"{r['ttft_p50_ms']:.3f}" if r["ttft_p50_ms"] is not None else "-"
                    lines.append(
                        f"| {body} | {mode} | {concurrency} | {target} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                        f"{added50 if target != 'direct' else 0:.3f} | {added99 if target != 'direct' else 0:.3f} | "
                        f"{ttft} | {r['req_per_s']:.0f} | {r['chunks_per_s']:.0f} | {r['errors']} |"
                    )
    for peer in args.peers:
        lines += [
            "",
            f"Ratios hiveroute / {peer} (lower added latency is better; higher throughput is better):",
            "",
        ]
        for body in args.bodies:
            for hive in ("hiveroute:round_robin", "hiveroute:workflow"):
                for mode in ("whole", "stream"):
                    for concurrency in (1, 64, 512):
                        h, s, d = (
                            by.get((body, t, mode, concurrency)) for t in (hive, peer, "direct")
                        )
                        if h and s and d:
                            lines.append(
                                f"- {body}, {hive}, {mode}, {concurrency} clients: added p50 "
                                f"{h['p50_ms'] - d['p50_ms']:.3f} ms vs {s['p50_ms'] - d['p50_ms']:.3f} ms; "
                                f"throughput ratio {h['req_per_s'] / s['req_per_s']:.2f}"
                            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gateway_overhead.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "gateway_overhead.json").write_text(
        json.dumps({"argv": sys.argv, "rows": rows}, indent=1)
    )
    print("\n".join(lines))
    print(f"\nreport: {RESULTS / 'gateway_overhead.md'}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunks", type=int, default=32, help="chunks per streamed response")
    parser.add_argument("--n1", type=int, default=1000, help="requests at 1 client")
    parser.add_argument("--n64", type=int, default=10000, help="requests at 64 clients")
    parser.add_argument("--n512", type=int, default=20000, help="requests at 512 clients")
    parser.add_argument("--quick", action="store_true", help="a tenth of the requests")
    parser.add_argument(
        "--bodies", type=comma_list, default="tiny,agentic", help="comma list: tiny, agentic"
    )
    parser.add_argument(
        "--peers", type=comma_list, default="", help="comma list of peer routers: sglang, smg"
    )
    parser.add_argument("--log-dir", default="/tmp/hiveroute-gateway-bench")
    args = parser.parse_args()
    if args.quick:
        args.n1, args.n64, args.n512 = args.n1 // 10, args.n64 // 10, args.n512 // 10
    runtime.use_fastest_event_loop()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
