"""What the router adds: the same requests sent to an engine directly and through routers.

    python benchmarks/gateway_overhead.py [--quick] [--peers sglang]

The engine is a minimal OpenAI-shaped server (instant answers, or a stream of N chunks), so
what is measured is the router, not a model. Pinned to cores where the machine has two: the
router under test gets core 1 alone ("on one core"); the engine and this load generator share
core 0. Targets are interleaved per (mode, concurrency) cell, so a noisy neighbour hits all of
them alike. Prints a table and writes benchmarks/results/gateway_overhead.{md,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from hiveroute import runtime
from hiveroute.runtime import free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


# --- the engine ---------------------------------------------------------------------------


def serve_engine(port: int, chunks: int) -> None:
    from aiohttp import web

    whole = json.dumps({
        "id": "cmpl-1", "object": "text_completion", "model": "m",
        "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
    }).encode()  # fmt: skip
    chunk = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"tok "}]}\n\n'
    models = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()

    async def completion(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.Response(body=whole, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(chunks):
            await response.write(chunk)
            await asyncio.sleep(0)  # one chunk per event-loop turn, as an engine's steps are
        await response.write(b"data: [DONE]\n\n")
        return response

    async def ok(request: web.Request) -> web.Response:
        return web.Response(body=models, content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    app = web.Application()
    app.router.add_post("/v1/completions", completion)
    app.router.add_get("/v1/models", ok)
    app.router.add_get("/health", ok)
    app.router.add_get("/metrics", metrics)
    runtime.use_fastest_event_loop()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, backlog=4096)


# --- processes ----------------------------------------------------------------------------


def pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > core:
        os.sched_setaffinity(0, {core})


def start(cmd: list[str], core: int, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "wb")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=lambda: pin(core))


async def wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status < 500:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{url} did not come up")


async def sglang_router_command(engine_url: str, port: int, logs: Path) -> list[str]:
    """SGLang's router, installed once into its own venv by hiveroute.bench.peers."""
    from hiveroute.bench.peers import PEERS, ensure_peer, peer_argv

    peer = PEERS["sglang"]
    python = await ensure_peer(peer, logs / "sglang-install.log")
    return peer_argv(peer, python, port, free_port(), [engine_url], "round_robin")


# --- load -----------------------------------------------------------------------------------


@dataclass
class Cell:
    target: str
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
            "target": self.target, "mode": self.mode, "concurrency": self.concurrency,
            "requests": self.requests, "errors": self.errors,
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            "ttft_p50_ms": pct(ttft, 50) if ttft else None, "ttft_p99_ms": pct(ttft, 99) if ttft else None,
            "req_per_s": self.requests / self.seconds, "chunks_per_s": self.chunks / self.seconds,
        }  # fmt: skip


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    index = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[index]


async def run_cell(url: str, target: str, mode: str, concurrency: int, total: int) -> Cell:
    stream = mode == "stream"
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 16, "stream": stream})
    headers = {"Content-Type": "application/json"}
    cell = Cell(target, mode, concurrency, total, 0.0)
    remaining = total
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                try:
                    async with http.post(
                        f"{url}/v1/completions", data=body, headers=headers
                    ) as resp:
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
    engine_port, router_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    procs = [
        start(
            [
                sys.executable,
                __file__,
                "--serve-engine",
                str(engine_port),
                "--chunks",
                str(args.chunks),
            ],
            0,
            logs / "engine.log",
        )
    ]
    targets = {"direct": engine_url}
    try:
        await wait_http(f"{engine_url}/health")
        router_cmd = [sys.executable, "-m", "hiveroute", "serve", "--engine", engine_url, "--host", "127.0.0.1",
                      "--port", str(router_port), "--policy", "round_robin", "--health-interval-s", "5"]  # fmt: skip
        procs.append(start(router_cmd, 1, logs / "hiveroute.log"))
        targets["hiveroute"] = f"http://127.0.0.1:{router_port}"
        await wait_http(f"{targets['hiveroute']}/health")
        if "sglang" in args.peers:
            sg_port = free_port()
            cmd = await sglang_router_command(engine_url, sg_port, logs)
            procs.append(start(cmd, 1, logs / "sglang-router.log"))
            targets["sglang"] = f"http://127.0.0.1:{sg_port}"
            await wait_http(f"{targets['sglang']}/health", timeout_s=120)
        cells: list[Cell] = []
        plan = [(1, args.n1), (64, args.n64), (512, args.n512)]
        for mode in ("whole", "stream"):
            for concurrency, total in plan:
                for target, url in targets.items():  # interleaved: warm-up then measure
                    await run_cell(url, target, mode, concurrency, max(concurrency, total // 10))
                    cell = await run_cell(url, target, mode, concurrency, total)
                    cells.append(cell)
                    s = cell.summary()
                    print(f"{mode:6} c={concurrency:<4} {target:10} p50={s['p50_ms']:8.3f} ms  p99={s['p99_ms']:8.3f} ms  "
                          f"{s['req_per_s']:9.1f} req/s  {s['chunks_per_s']:10.1f} chunks/s  errors={cell.errors}", file=sys.stderr)  # fmt: skip
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)
    write_report(args, [c.summary() for c in cells], list(targets))
    return 0


def write_report(args: argparse.Namespace, rows: list[dict[str, Any]], targets: list[str]) -> None:
    by = {(r["target"], r["mode"], r["concurrency"]): r for r in rows}
    lines = [
        "# Gateway overhead",
        "",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}",
        f"- command: `{' '.join(shlex.quote(a) for a in sys.argv)}`",
        "- engine: instant OpenAI-shaped server (stream: "
        f"{args.chunks} chunks); routers pinned to core 1, engine and load generator to core 0",
        "",
        "Added latency is the router's percentile minus the direct percentile in the same cell.",
        "",
        "| mode | clients | target | p50 ms | p99 ms | added p50 ms | added p99 ms | TTFT p50 ms | req/s | chunks/s | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for mode in ("whole", "stream"):
        for concurrency in (1, 64, 512):
            direct = by.get(("direct", mode, concurrency))
            for target in targets:
                r = by.get((target, mode, concurrency))
                if r is None or direct is None:
                    continue
                added50 = r["p50_ms"] - direct["p50_ms"]
                added99 = r["p99_ms"] - direct["p99_ms"]
                ttft = f"{r['ttft_p50_ms']:.3f}" if r["ttft_p50_ms"] is not None else "-"
                lines.append(
                    f"| {mode} | {concurrency} | {target} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                    f"{added50 if target != 'direct' else 0:.3f} | {added99 if target != 'direct' else 0:.3f} | "
                    f"{ttft} | {r['req_per_s']:.0f} | {r['chunks_per_s']:.0f} | {r['errors']} |"
                )
    if "sglang" in targets:
        lines += [
            "",
            "Ratios hiveroute / sglang (lower added latency is better; higher throughput is better):",
            "",
        ]
        for mode in ("whole", "stream"):
            for concurrency in (1, 64, 512):
                h, s, d = (
                    by.get((t, mode, concurrency)) for t in ("hiveroute", "sglang", "direct")
                )
                if h and s and d:
                    lines.append(
                        f"- {mode}, {concurrency} clients: added p50 {h['p50_ms'] - d['p50_ms']:.3f} ms vs "
                        f"{s['p50_ms'] - d['p50_ms']:.3f} ms; throughput ratio {h['req_per_s'] / s['req_per_s']:.2f}"
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
    parser.add_argument("--serve-engine", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--chunks", type=int, default=32, help="chunks per streamed response")
    parser.add_argument("--n1", type=int, default=1000, help="requests at 1 client")
    parser.add_argument("--n64", type=int, default=10000, help="requests at 64 clients")
    parser.add_argument("--n512", type=int, default=20000, help="requests at 512 clients")
    parser.add_argument("--quick", action="store_true", help="a tenth of the requests")
    parser.add_argument("--peers", default="", help="comma list of peer routers to include: sglang")
    parser.add_argument("--log-dir", default="/tmp/hiveroute-gateway-bench")
    args = parser.parse_args()
    if args.serve_engine:
        serve_engine(args.serve_engine, args.chunks)
        return 0
    if args.quick:
        args.n1, args.n64, args.n512 = args.n1 // 10, args.n64 // 10, args.n512 // 10
    args.peers = [p for p in args.peers.split(",") if p]
    runtime.use_fastest_event_loop()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
