"""How routing quality holds with 1, 2 and 4 router replicas sharing one Redis.

    python benchmarks/replicas.py [--quick] [--workflows 40] [--concurrency 8]

The same agentic workload (a planner, a fan-out of executors, a validator; every agent's
prompt starts with its workflow's large shared context) runs against 4 simulated engines
(`hiveroute sim`, llama-8b-h100 cost model) through N router processes (`hiveroute serve
--policy workflow`). The load generator sends request i to replica i mod N, so every workflow's
requests are spread over every replica. Configurations: 1, 2 and 4 replicas sharing Redis, and
as controls 1 and 4 replicas with in-memory state (nothing shared). Each configuration gets a
fresh simulator (empty caches) and a flushed Redis. Keep-warm is off so only routing differs.

Measured per configuration: prefix-cache hit rate (cached / prompt tokens, from the engines'
usage), TTFT p50/p99 at the client (first streamed token), how many engines a workflow's
requests touched, and the routers' own overhead (which includes the state-store round trips). Prints a table and writes benchmarks/results/replicas.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from hiveroute.bench.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

ENGINES = 4
WORDS = "alpha beta gamma delta kernel cache block token agent plan tool result index".split()


# --- processes ----------------------------------------------------------------------------


def free_block(n: int) -> int:
    """A base port with n free consecutive ports after it."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 60_000 - n)
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port block")


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = log.open("ab")
    return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


async def wait_healthy(http: aiohttp.ClientSession, urls: list[str], what: str) -> None:
    deadline = time.monotonic() + 60
    for url in urls:
        while True:
            try:
                async with http.get(f"{url}/health") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} at {url} did not become healthy")
            await asyncio.sleep(0.1)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


# --- workload -----------------------------------------------------------------------------


@dataclass
class Sample:
    workflow: str
    engine: str
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    failures: int = 0
    first_error: str | None = None
    wall_s: float = 0.0


class Driver:
    def __init__(
        self, http: aiohttp.ClientSession, replicas: list[str], model: str, args: Any
    ) -> None:
        self.http = http
        self.model = model
        self.replicas = replicas
        self.args = args
        self.counter = 0
        self.run = Run()

    async def request(self, workflow: str, agent: str, prompt: str) -> str:
        replica = self.replicas[self.counter % len(self.replicas)]  # round robin
        self.counter += 1
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": self.args.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "hiveroute": {"workflow_id": workflow, "agent_id": agent},
        }
        started = time.perf_counter()
        ttft: float | None = None
        usage: dict[str, Any] = {}
        text: list[str] = []
        import json

        try:
            async with self.http.post(f"{replica}/v1/completions", json=body) as resp:
                if resp.status != 200:
                    self.run.failures += 1
                    error = (await resp.read())[:300].decode(errors="replace")
                    self.run.first_error = self.run.first_error or f"{resp.status} {error}"
                    return ""
                engine = resp.headers.get("X-Hiveroute-Engine", "?")
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    for choice in chunk.get("choices") or []:
                        if choice.get("text"):
                            if ttft is None:
                                ttft = time.perf_counter() - started
                            text.append(choice["text"])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
        except aiohttp.ClientError as exc:
            self.run.failures += 1
            self.run.first_error = self.run.first_error or repr(exc)
            return ""
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.run.samples.append(
            Sample(
                workflow=workflow,
                engine=engine,
                ttft_s=ttft if ttft is not None else time.perf_counter() - started,
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                cached_tokens=int(cached),
            )
        )
        return "".join(text)

    async def workflow(self, index: int, seed: int) -> None:
        rng = random.Random(seed * 100_003 + index)
        wid = f"wf-{seed}-{index}"
        context = " ".join(rng.choice(WORDS) for _ in range(self.args.context_words))
        head = f"Shared context of workflow {wid}:\n{context}\n\n"
        plan = await self.request(wid, "planner", head + "Planner: split the task.")
        results = await asyncio.gather(
            *(
                self.request(wid, f"executor-{i}", head + f"Plan: {plan}\nExecutor {i}: part {i}.")
                for i in range(self.args.fanout)
            )
        )
        await self.request(wid, "validator", head + "Validator: check " + " | ".join(results))

    async def run_all(self, seed: int) -> Run:
        gate = asyncio.Semaphore(self.args.concurrency)

        async def one(i: int) -> None:
            async with gate:
                await self.workflow(i, seed)

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(self.args.workflows)))
        self.run.wall_s = time.perf_counter() - started
        return self.run


# --- one configuration --------------------------------------------------------------------


@dataclass
class Config:
    replicas: int
    shared: bool

    @property
    def label(self) -> str:
        return f"{self.replicas} replica{'s' if self.replicas > 1 else ''}, " + (
            "Redis" if self.shared else "memory (not shared)"
        )


async def run_config(
    config: Config, seed: int, redis: RedisServer, args: Any, logs: Path
) -> tuple[Run, float]:
    """One run of `config`: its samples and the replicas' mean router overhead (ms)."""
    procs: list[subprocess.Popen[bytes]] = []
    python = sys.executable
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        try:
            import redis as redis_py

            redis_py.Redis.from_url(redis.url).flushall()
            base, events = free_block(ENGINES), free_block(2 * ENGINES + 100)
            procs.append(
                spawn(
                    [python, "-m", "hiveroute", "sim", "--engines", str(ENGINES),
                     "--base-port", str(base), "--events-base-port", str(events),
                     "--preset", args.preset, "--log-level", "warning"],
                    logs / "sim.log",
                )
            )  # fmt: skip
            engine_urls = [f"http://127.0.0.1:{base + i}" for i in range(ENGINES)]
            await wait_healthy(http, engine_urls, "sim engine")
            specs = [f"{u},events=tcp://127.0.0.1:{events + i}" for i, u in enumerate(engine_urls)]
            ports = [free_block(1) for _ in range(config.replicas)]
            state = redis.url if config.shared else "memory"
            for port in ports:
                cmd = [python, "-m", "hiveroute", "serve", "--host", "127.0.0.1",
                       "--port", str(port), "--policy", "workflow", "--state", state,
                       "--keep-warm-interval-s", "0", "--log-level", "warning",
                       "--workers", "1"]  # fmt: skip
                for spec in specs:
                    cmd += ["--engine", spec]
                procs.append(spawn(cmd, logs / f"router-{port}.log"))
            replicas = [f"http://127.0.0.1:{p}" for p in ports]
            await wait_healthy(http, replicas, "router")
            await asyncio.sleep(1.0)  # first load scrape of every engine
            async with http.get(f"{engine_urls[0]}/v1/models") as resp:
                model = (await resp.json())["data"][0]["id"]
            run = await Driver(http, replicas, model, args).run_all(seed)
            overhead_sum = overhead_count = 0.0
            for replica in replicas:
                async with http.get(f"{replica}/metrics") as resp:
                    for line in (await resp.text()).splitlines():
                        name, _, value = line.rpartition(" ")
                        if name.startswith("hiveroute_router_overhead_seconds_sum"):
                            overhead_sum += float(value)
                        elif name.startswith("hiveroute_router_overhead_seconds_count"):
                            overhead_count += float(value)
        finally:
            stop(procs)
    overhead = 1000 * overhead_sum / overhead_count if overhead_count else float("nan")
    return run, overhead


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(config: Config, runs: list[Run], overheads: list[float]) -> dict[str, Any]:
    samples = [s for run in runs for s in run.samples]
    per_workflow: dict[str, list[str]] = defaultdict(list)
    for s in samples:
        per_workflow[s.workflow].append(s.engine)
    prompt = sum(s.prompt_tokens for s in samples)
    cached = sum(s.cached_tokens for s in samples)
    on_main = sum(max(engines.count(e) for e in set(engines)) for engines in per_workflow.values())
    ttfts = [s.ttft_s for s in samples]
    return {
        "config": config.label,
        "requests": len(samples),
        "failures": sum(run.failures for run in runs),
        "hit_rate": cached / prompt if prompt else 0.0,
        "ttft_p50_ms": 1000 * percentile(ttfts, 0.50),
        "ttft_p99_ms": 1000 * percentile(ttfts, 0.99),
        "engines_per_workflow": sum(len(set(e)) for e in per_workflow.values())
        / max(1, len(per_workflow)),
        "on_main_engine": on_main / max(1, len(samples)),
        "overhead_ms": sum(overheads) / max(1, len(overheads)),
        "wall_s": sum(run.wall_s for run in runs) / max(1, len(runs)),
    }


# --- report -------------------------------------------------------------------------------

COLUMNS = [
    ("config", "configuration", "{}"),
    ("requests", "requests", "{}"),
    ("failures", "failed", "{}"),
    ("hit_rate", "prefix-cache hit rate", "{:.1%}"),
    ("ttft_p50_ms", "TTFT p50 (ms)", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99 (ms)", "{:.0f}"),
    ("engines_per_workflow", "engines / workflow", "{:.2f}"),
    ("on_main_engine", "requests on the workflow's main engine", "{:.1%}"),
    ("overhead_ms", "router overhead, mean (ms)", "{:.1f}"),
    ("wall_s", "wall per run (s)", "{:.1f}"),
]


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(fmt.format(row[key]) for key, _, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.release()}, {os.cpu_count()} CPU(s) ({cpu}), "
        f"Python {platform.python_version()}; shared with other jobs"
    )


def code_version() -> str:
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{commit}{' (with uncommitted changes)' if dirty else ''}"


def write_report(rows: list[dict[str, Any]], args: Any, command: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "replicas.md"
    shared = {r["config"]: r for r in rows}
    one = shared.get(Config(1, True).label)
    four = shared.get(Config(4, True).label)
    four_mem = shared.get(Config(4, False).label)
    reading = []
    if one and four:
        reading.append(
            f"- With 4 replicas sharing Redis the hit rate is {four['hit_rate']:.1%} against "
            f"{one['hit_rate']:.1%} with one router, and TTFT p50/p99 "
            f"{four['ttft_p50_ms']:.0f}/{four['ttft_p99_ms']:.0f} ms against "
            f"{one['ttft_p50_ms']:.0f}/{one['ttft_p99_ms']:.0f} ms."
        )
    if one and shared.get(Config(1, False).label):
        alone = shared[Config(1, False).label]
        reading.append(
            f"- Router overhead with Redis is {one['overhead_ms']:.1f} ms a request (memory: "
            f"{alone['overhead_ms']:.1f} ms): the workflow bookkeeping makes about a dozen "
            "sequential state-store calls before a request is routed, and on this busy machine "
            "each round trip to the Redis process waits for a CPU."
        )
    if four_mem and four:
        reading.append(
            f"- Without shared state, 4 replicas spread each workflow over "
            f"{four_mem['engines_per_workflow']:.2f} engines (shared: "
            f"{four['engines_per_workflow']:.2f}), and the hit rate falls to "
            f"{four_mem['hit_rate']:.1%}."
        )
    text = f"""# Router replicas sharing Redis: routing quality with 1, 2 and 4 replicas

Date: {datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
Machine: {machine()}
Code: {code_version()}
Command: `{command}`

Workload, run {args.rounds} time(s) per configuration (configurations interleaved; the table
pools the runs): {args.workflows} workflows, {args.concurrency} at a time; each a planner, {args.fanout}
executors in parallel, a validator (6 requests), every prompt starting with the workflow's
shared context of {args.context_words} words; {args.max_tokens} output tokens per request.
Engines: {ENGINES} simulated engines (`hiveroute sim --preset {args.preset}`, fresh for each
configuration). Routers: `hiveroute serve --policy workflow --keep-warm-interval-s 0`, one
process per replica; request i goes to replica i mod N. "memory" rows are the control: the same
replicas with nothing shared.

{table(rows)}

"engines / workflow": distinct engines a workflow's requests went to. "requests on the
workflow's main engine": share of requests that went to the engine its workflow used most.
"router overhead": `hiveroute_router_overhead_seconds` (request in to request sent upstream:
parsing, workflow bookkeeping in the state store, routing), mean over every replica.

{chr(10).join(reading)}

TTFT is measured at the client, on a 2-core machine that also runs the simulator, the replicas
and this load generator, so it includes their CPU contention; compare rows, not absolute values.
"""
    path.write_text(text)
    return path


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--fanout", type=int, default=4)
    parser.add_argument("--context-words", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--preset", default="llama-8b-h100")
    parser.add_argument("--replicas", default="1,2,4", help="replica counts sharing Redis")
    parser.add_argument("--no-controls", action="store_true", help="skip the memory rows")
    parser.add_argument(
        "--rounds", type=int, default=2, help="runs of every configuration, interleaved"
    )
    parser.add_argument("--quick", action="store_true", help="a small run (12 workflows)")
    args = parser.parse_args()
    if args.quick:
        args.workflows, args.concurrency, args.rounds = 12, 4, 1
    configs = [Config(int(n), True) for n in args.replicas.split(",")]
    if not args.no_controls:
        configs = [Config(1, False), *configs, Config(4, False)]
    command = shlex.join(["python", "benchmarks/replicas.py", *sys.argv[1:]])
    runs: dict[str, list[tuple[Run, float]]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="hiveroute-replicas-") as tmp:
        logs = Path(tmp)
        redis = RedisServer(workdir=logs)
        redis.start()
        try:
            for round_ in range(args.rounds):  # interleaved: a noisy neighbour hits all alike
                for index, config in enumerate(configs):
                    seed = round_ * len(configs) + index
                    run, overhead = await run_config(config, seed, redis, args, logs)
                    runs[config.label].append((run, overhead))
                    row = summarize(config, [run], [overhead])
                    print(
                        f"round {round_ + 1}: {row['config']:<32} hit {row['hit_rate']:6.1%}  "
                        f"TTFT p50 {row['ttft_p50_ms']:5.0f} ms  p99 {row['ttft_p99_ms']:5.0f} ms"
                        f"  engines/wf {row['engines_per_workflow']:.2f}  "
                        f"overhead {row['overhead_ms']:.1f} ms  failed {row['failures']}",
                        flush=True,
                    )
                    if run.first_error:
                        print(f"  first failure: {run.first_error}", flush=True)
        finally:
            redis.stop()
    rows = [
        summarize(config, [r for r, _ in runs[config.label]], [o for _, o in runs[config.label]])
        for config in configs
    ]
    print(table(rows))
    print(f"wrote {write_report(rows, args, command)}")


if __name__ == "__main__":
    asyncio.run(main())
