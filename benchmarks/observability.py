"""Observability's costs and a look at it: two commands that print figures and write reports.

    python benchmarks/observability.py overhead [--requests 400] [--concurrency 8] [--rounds 3]
    python benchmarks/observability.py dashboard [--workflows 4] [--out docs/dashboard.png]

`overhead` streams through a router to an in-process stand-in engine with tracing off (the
default) and on (spans batched to memory), interleaved, and reports the router's own overhead
(hiveroute_router_overhead_seconds), client latency, and the cost of the per-chunk `data:` count
the relay does for inter-token latency. `dashboard` runs an agentic workload (planner, three
executors, validator sharing a long context) on simulated engines and saves a screenshot of
/dashboard taken in headless Chromium. Reports go to benchmarks/results/observability_*.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shlex
import statistics
import sys
import time
import timeit
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support (stand-in engine, Chromium driver)

import aiohttp  # noqa: E402

from hiveroute import runtime  # noqa: E402
from hiveroute.assembly import assemble  # noqa: E402
from hiveroute.config import RouterConfig  # noqa: E402
from hiveroute.observability.tracing import Tracing  # noqa: E402
from hiveroute.server import start_router  # noqa: E402
from hiveroute.sim.config import SimConfig  # noqa: E402
from hiveroute.sim.fleet import SimFleet  # noqa: E402
from tests.support.chromium import Chromium  # noqa: E402
from tests.support.fake_engine import FakeEngine  # noqa: E402
from tests.support.router_app import serve_router  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def shown_path(path: Path) -> str:
    """A path as the report shows it: relative to the repository when it is inside."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def write_report(name: str, title: str, body: str) -> Path:
    """benchmarks/results/NAME.md: the figures with the date, machine and exact command."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    command = " ".join(shlex.quote(a) for a in ["python", *sys.argv])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    path.write_text(
        f"# {title}\n\n- date: {datetime.now(UTC).isoformat(timespec='seconds')}\n"
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, "
        f"Python {platform.python_version()}, load average {load:.2f} at the end\n"
        f"- command: `{command}`\n\n{body}\n"
    )
    return path


# --- overhead ---------------------------------------------------------------------------------


async def run(tracing: bool, requests: int, concurrency: int, chunks: int) -> dict[str, Any]:
    engine = FakeEngine()
    engine.behaviour.stream_chunks = chunks
    await engine.start()
    config = RouterConfig(engine=[engine.url], host="127.0.0.1", port=0).validate()
    router = assemble(config)
    if tracing:
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        router.tracing = Tracing.with_exporter(InMemorySpanExporter(), batch=True)
        router.components.append(router.tracing)
    running = await start_router(config, router=router)
    latencies: list[float] = []
    body = {"model": "m", "prompt": "p", "stream": True, "hiveroute": {"agent_role": "planner"}}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)

    async def worker(http: aiohttp.ClientSession) -> None:
        while not queue.empty():
            queue.get_nowait()
            start = time.perf_counter()
            async with http.post(f"{running.url}/v1/completions", json=body) as resp:
                await resp.read()
            latencies.append(time.perf_counter() - start)

    try:
        async with aiohttp.ClientSession() as http:
            await worker(http)  # warm-up is the first request; the rest run concurrently
            latencies.clear()
            for i in range(requests):
                queue.put_nowait(i)
            began = time.perf_counter()
            await asyncio.gather(*(worker(http) for _ in range(concurrency)))
            elapsed = time.perf_counter() - began
        m = router.metrics
        overhead_sum = m.value(
            "hiveroute_router_overhead_seconds_sum", {"policy": router.policy.name}
        )
        overhead_n = m.value(
            "hiveroute_router_overhead_seconds_count", {"policy": router.policy.name}
        )
    finally:
        await running.stop()
        await engine.stop()
    latencies.sort()
    return {
        "tracing": "on" if tracing else "off",
        "req_per_s": requests / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "overhead_us": overhead_sum / overhead_n * 1e6 if overhead_n else float("nan"),
    }


def count_cost_ns() -> float:
    chunk = (
        b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m",'
        b'"choices":[{"index":0,"text":" token","logprobs":null,"finish_reason":null}]}\n\n'
    )
    n = 200_000
    seconds = timeit.timeit(lambda: chunk.count(b"data:") - chunk.count(b"data: [DONE]"), number=n)
    return seconds / n * 1e9


def overhead(args: argparse.Namespace) -> None:
    runs = []
    for _ in range(args.rounds):  # interleaved, to even out a busy machine
        for tracing in (False, True):
            runs.append(runtime.run(run(tracing, args.requests, args.concurrency, args.chunks)))
    rows = []
    for mode in ("off", "on"):
        mine = [r for r in runs if r["tracing"] == mode]
        median = {k: statistics.median(r[k] for r in mine) for k in mine[0] if k != "tracing"}
        rows.append({"tracing": mode, **median})
    count_ns = count_cost_ns()
    lines = [
        f"{args.requests} streamed requests of {args.chunks} events each, "
        f"{args.concurrency} at a time, router and stand-in engine in one process; "
        f"median of {args.rounds} interleaved runs per mode (the machine is shared: expect noise).",
        "",
        "| tracing | requests/s | client p50 (ms) | client p99 (ms) | router overhead (µs, mean) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['tracing']} | {r['req_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
            f"| {r['overhead_us']:.0f} |"
        )
    lines += [
        "",
        f"TBT accounting in the relay: {count_ns:.0f} ns a chunk (two `bytes.count` calls on a "
        "typical vLLM completion chunk), i.e. "
        f"{count_ns * args.chunks / 1000:.1f} µs for a {args.chunks}-event response.",
    ]
    body = "\n".join(lines)
    print(body)
    print(write_report("observability_overhead", "Observability overhead", body))


# --- dashboard --------------------------------------------------------------------------------

WORDS = "plan task tool result context model cache agent review step data code test".split()


def context(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def agent(
    http: aiohttp.ClientSession, url: str, model: str, wf: str, shared: str, who: str, role: str
) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": shared},
            {"role": "user", "content": f"As the {role} ({who}), do your part of {wf}."},
        ],
        "max_tokens": 48,
        "stream": True,
        "stream_options": {"include_usage": True},
        "hiveroute": {"workflow_id": wf, "agent_id": who, "agent_role": role},
    }
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        await resp.read()
    return {}


async def workflow(http: aiohttp.ClientSession, url: str, model: str, index: int) -> None:
    wf = f"review-{index}"
    shared = context(index, 1500)
    await agent(http, url, model, wf, shared, "planner", "planner")
    await asyncio.sleep(0.05)
    await asyncio.gather(
        *(agent(http, url, model, wf, shared, f"executor-{i}", "executor") for i in (1, 2, 3))
    )
    await asyncio.sleep(0.05)
    await agent(http, url, model, wf, shared, "validator", "validator")


async def main_async(args: argparse.Namespace) -> str:
    fleet = SimFleet(SimConfig(engines=3, base_port=0, events_base_port=0, preset=args.preset))
    await fleet.start()
    config = RouterConfig(
        engine=fleet.engine_spec_texts(), host="127.0.0.1", port=0, policy=args.policy
    ).validate()
    served = await serve_router(assemble(config))
    model = fleet.config.model_name()
    try:
        async with aiohttp.ClientSession() as http, Chromium(window=(1400, 1000)) as browser:
            await browser.goto(f"{served.url}/dashboard?refresh=500&workflow=review-0")
            for start in range(0, args.workflows, 2):
                await asyncio.gather(
                    *(
                        workflow(http, served.url, model, i)
                        for i in range(start, min(start + 2, args.workflows))
                    )
                )
            await asyncio.sleep(1.5)  # two more polls: the charts catch up
            await browser.screenshot(Path(args.out))
            async with http.get(f"{served.url}/dashboard/api/overview") as resp:
                overview = await resp.json()
            async with http.get(f"{served.url}/v1/workflows/review-0") as resp:
                first = await resp.json()
    finally:
        await served.stop()
        await fleet.stop()
    t = overview["totals"]
    lines = [
        f"{args.workflows} workflows (planner, 3 executors, validator; ~1500-word shared context) "
        f"on 3 simulated engines (preset {args.preset}), policy {args.policy}.",
        "",
        f"- requests: {t['requests']}, prompt tokens: {t['prompt_tokens']}, "
        f"cached: {t['cached_tokens']} (hit rate {t['hit_rate']:.1%})",
        f"- workflow review-0: TTFT {first['totals']['workflow_ttft_s'] * 1000:.1f} ms, "
        f"completion {first['totals']['completion_time_s']:.2f} s, "
        f"hit rate {first['totals']['hit_rate']:.1%}",
        f"- screenshot: {shown_path(Path(args.out))}",
    ]
    return "\n".join(lines)


def dashboard_demo(args: argparse.Namespace) -> None:
    body = runtime.run(main_async(args))
    print(body)
    print(write_report("observability_dashboard", "Dashboard demo", body))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    o = sub.add_parser("overhead", help="what tracing and TBT accounting cost")
    o.add_argument("--requests", type=int, default=400)
    o.add_argument("--concurrency", type=int, default=8)
    o.add_argument("--chunks", type=int, default=32, help="SSE events per response")
    o.add_argument("--rounds", type=int, default=3, help="runs of each mode, interleaved")
    o.set_defaults(func=overhead)
    d = sub.add_parser("dashboard", help="an agentic workload and a screenshot of /dashboard")
    d.add_argument("--workflows", type=int, default=4)
    d.add_argument("--preset", default="llama-8b-h100")
    d.add_argument("--policy", default="workflow", help="routing policy (hiveroute's default)")
    d.add_argument("--out", default=str(ROOT / "docs" / "dashboard.png"))
    d.set_defaults(func=dashboard_demo)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
