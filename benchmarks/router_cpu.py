"""The router's own CPU per request, and the most requests/s, on agentic chat bodies.

    python -m benchmarks.router_cpu [--quick] [--sizes 1000,4000,16000] [--reps 3]

Each body is one agent's chat request in a workflow: a long shared context (the workflow's
document, as the system message) and the agent's own message (a few hundred words, different in
every request), with `X-Workflow-Id` / `X-Agent-Id` headers; 8 workflows in turn. Sizes are in
words of the whole body (1k, 4k, 16k by default; a 4k-word body is about 28 kB of JSON).

For each router and size, a closed loop of `--clients` clients sends requests for `--seconds`
after a warm-up; the router's CPU time (user + system of its processes and threads, from
/proc/PID/stat, before and after) over the requests answered is its CPU ms per request, and the
requests answered per second is its most requests/s at that concurrency.

- `instant` engines: two minimal OpenAI-shaped servers (benchmarks.instant_engine) that answer at
  once and publish no KV events: hiveroute's `kv` then sees an empty index (every request a miss,
  decided on load), `workflow` its own decisions (it falls back to them for engines without
  events). The costs measured are parsing, tokenizing, keying, scoring, accounting, relaying.
- `sim` engines: `hiveroute sim --engines 2 --preset fast` with KV events, so `kv` and
  `workflow` also apply the engines' events (their decode and index updates count as the router's
  CPU); the simulator tokenizes every prompt, so its requests/s say little.

Workers: 1 worker = the router pinned to core 1, the engines and this load generator on core 0.
2 workers = the router on both cores (the Rust peers' runtime uses a thread a core; hiveroute runs
`serve --workers 2` where it has it, else two processes on two ports with clients split between
them); the engines and load generator still share core 0 with it, so on a 2-core machine the
2-worker figure is bounded by the machine, not by the router alone.

`aiohttp-relay` (benchmarks.aiohttp_relay) is the floor of any router built on hiveroute's HTTP
stack: aiohttp's server and client with uvloop relaying bytes, no parsing or routing.

Targets are interleaved within each repetition (a noisy neighbour hits all alike); medians of
`--reps` repetitions. Writes benchmarks/results/router_cpu.{md,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.agentic_bodies import AGENTS, WORKFLOWS, agentic_bodies
from benchmarks.cli import comma_ints, comma_list
from benchmarks.instant_engine import (
    peer_command,
    pin,
    start,
    start_engine,
    stop_all,
    wait_http,
)
from benchmarks.report import commit
from hiveroute import runtime
from hiveroute.bench.procs import tree_cpu_seconds
from hiveroute.runtime import free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


# --- targets --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str  # hiveroute:kv, smg, sglang, direct, base:workflow
    # hiveroute | peer | direct | relay (benchmarks.aiohttp_relay: the HTTP stack alone) |
    # splice (benchmarks.splice_relay: uvloop's sockets alone)
    kind: str
    policy: str | None
    source: str | None = None  # another hiveroute checkout (PYTHONPATH), for before/after


TARGETS = {
    "direct": Target("direct", "direct", None),
    "hiveroute:round_robin": Target("hiveroute:round_robin", "hiveroute", "round_robin"),
    "hiveroute:kv": Target("hiveroute:kv", "hiveroute", "kv"),
    "hiveroute:workflow": Target("hiveroute:workflow", "hiveroute", "workflow"),
    "aiohttp-relay": Target("aiohttp-relay", "relay", None),
    "splice-relay": Target("splice-relay", "splice", None),
    "smg": Target("smg", "peer", None),
    "sglang": Target("sglang", "peer", None),
}


RELAYS = {"relay": "benchmarks.aiohttp_relay", "splice": "benchmarks.splice_relay"}


def hiveroute_has_workers() -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "hiveroute", "serve", "--help"], capture_output=True, text=True
    ).stdout
    return "--workers" in out


@dataclass
class Running:
    urls: list[str]
    procs: list[subprocess.Popen[bytes]]

    def cpu(self) -> float:
        return sum(tree_cpu_seconds(p.pid) or 0.0 for p in self.procs)


def source_has_workers(source: str | None) -> bool:
    """Whether a hiveroute checkout (None: this one) has `serve --workers`."""
    return source is None or (Path(source) / "hiveroute" / "workers.py").exists()


async def start_target(
    target: Target, engines: list[str], workers: int, logs: Path, has_workers: bool
) -> Running:
    cores = (1,) if workers == 1 else (0, 1)
    tag = f"{target.name.replace(':', '-')}-w{workers}"
    if target.kind == "direct":
        return Running([e.split(",")[0] for e in engines], [])
    if target.kind in RELAYS or target.kind == "peer":  # one process, in front of the engines
        port = free_port()
        urls = [e.split(",")[0] for e in engines]
        if target.kind in RELAYS:
            cmd = [sys.executable, "-m", RELAYS[target.kind], str(port)]
            cmd += [a for u in urls for a in ("--engine", u)]
        else:
            cmd = await peer_command(target.name, urls, port, None, logs)
        proc = start(cmd, cores, logs / f"{tag}.log")
        url = f"http://127.0.0.1:{port}"
        await wait_http(f"{url}/health", timeout_s=120 if target.kind == "peer" else 60)
        return Running([url], [proc])
    engine_args = [a for e in engines for a in ("--engine", e)]
    base = [sys.executable, "-m", "hiveroute", "serve", *engine_args, "--host", "127.0.0.1",
            "--policy", str(target.policy), "--log-level", "warning", "--health-interval-s", "5",
            "--keep-warm-interval-s", "0"]  # fmt: skip
    env = {"PYTHONPATH": target.source} if target.source else None
    # a baseline checkout (target.source) that predates --workers runs one process per port
    serves_workers = has_workers and source_has_workers(target.source)
    processes = 1 if (workers == 1 or serves_workers) else workers
    extra = ["--workers", str(workers)] if serves_workers else []
    running = Running([], [])
    for i in range(processes):
        port = free_port()
        cmd = [*base, "--port", str(port), *extra]
        running.procs.append(start(cmd, cores, logs / f"{tag}-{i}.log", env, cwd=target.source))
        running.urls.append(f"http://127.0.0.1:{port}")
    for url in running.urls:
        await wait_http(f"{url}/health", timeout_s=120)
    return running


# --- load -----------------------------------------------------------------------------------


async def closed_loop(
    urls: list[str], bodies: list[tuple[bytes, dict[str, str]]], clients: int, seconds: float,
    running: Running,
) -> dict[str, float]:  # fmt: skip
    """`clients` clients for `seconds`; requests/s and the router's CPU ms per request."""
    connector = aiohttp.TCPConnector(limit=0)
    done = errors = 0
    measuring = False
    stop_at = 0.0
    async with aiohttp.ClientSession(connector=connector) as http:

        async def client(k: int) -> None:
            nonlocal done, errors
            i = k
            while time.perf_counter() < stop_at:
                body, headers = bodies[i % len(bodies)]
                url = urls[i % len(urls)]
                i += clients
                try:
                    async with http.post(
                        f"{url}/v1/chat/completions", data=body, headers=headers
                    ) as r:
                        await r.read()
                        ok = r.status == 200
                except aiohttp.ClientError:
                    ok = False
                if measuring:
                    done += ok
                    errors += not ok

        # warm-up: a quarter of the time (at least 1 s), then measure
        stop_at = time.perf_counter() + max(1.0, seconds / 4)
        await asyncio.gather(*(client(k) for k in range(clients)))
        measuring = True
        cpu0, t0 = running.cpu(), time.perf_counter()
        stop_at = t0 + seconds
        await asyncio.gather(*(client(k) for k in range(clients)))
        elapsed, cpu = time.perf_counter() - t0, running.cpu() - cpu0
    return {
        "requests": done,
        "errors": errors,
        "req_per_s": done / elapsed,
        "cpu_ms_per_req": (cpu * 1000 / done) if done and running.procs else float("nan"),
        "cpu_cores": cpu / elapsed,
    }


# --- engines --------------------------------------------------------------------------------


async def start_engines(kind: str, logs: Path) -> tuple[list[str], list[subprocess.Popen[bytes]]]:
    if kind == "instant":
        ports = [free_port(), free_port()]
        procs = [start_engine(p, 32, (0,), logs / f"engine-{p}.log") for p in ports]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for url in urls:
            await wait_http(f"{url}/health")
        return urls, procs
    cmd = [sys.executable, "-m", "hiveroute", "sim", "--engines", "2", "--base-port", "0",
           "--events-base-port", "0", "--preset", "fast", "--model", "m", "--time-scale", "0.01",
           "--num-blocks", "65536", "--max-model-len", "131072", "--log-level", "warning"]  # fmt: skip
    out = open(logs / "sim.out", "wb")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=out, preexec_fn=lambda: pin(0))
    specs: list[str] = []
    assert proc.stdout is not None
    while len(specs) < 2:
        line = await asyncio.to_thread(proc.stdout.readline)
        if not line:
            raise RuntimeError(f"hiveroute sim exited; see {logs / 'sim.out'}")
        text = line.decode().strip()
        if text.startswith("--engine "):
            specs.append(text.split(" ", 1)[1])
    for spec in specs:
        await wait_http(f"{spec.split(',')[0]}/health")
    return specs, [proc]


# --- the run --------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> int:
    pin(0)
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    has_workers = hiveroute_has_workers()
    bodies = {size: agentic_bodies(size, args.bodies) for size in args.sizes}
    rows: list[dict[str, Any]] = []
    plan: list[tuple[str, list[str], list[int]]] = [
        ("instant", args.targets, args.workers),
        ("sim", args.sim_targets, [1]),
    ]
    for engine_kind, targets, workers_list in plan:
        if not targets:
            continue
        engines, engine_procs = await start_engines(engine_kind, logs)
        try:
            for workers in workers_list:
                for rep in range(args.reps):
                    for name in targets:
                        target = TARGETS[name]
                        one_process = (
                            target.kind == "direct"
                            or target.kind in RELAYS
                            or (target.source and not source_has_workers(target.source))
                        )
                        if one_process and workers != workers_list[0]:
                            continue  # engines, relay and an old baseline alone: at 1 worker
                        running = await start_target(target, engines, workers, logs, has_workers)
                        try:
                            for size in args.sizes:
                                r = await closed_loop(
                                    running.urls, bodies[size], args.clients, args.seconds, running
                                )
                                row = {"engines": engine_kind, "target": name, "workers": workers,
                                       "size_words": size, "rep": rep, **r}  # fmt: skip
                                rows.append(row)
                                print(f"{engine_kind:7} w={workers} rep={rep} {name:22} {size:>6} words  "
                                      f"{r['cpu_ms_per_req']:6.3f} CPU ms/req  {r['req_per_s']:7.1f} req/s  "
                                      f"{r['cpu_cores']:.2f} cores  errors={r['errors']}", file=sys.stderr)  # fmt: skip
                        finally:
                            stop_all(running.procs)
        finally:
            stop_all(engine_procs)
    write_report(args, rows, has_workers)
    return 0


def _median(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r[key] == r[key]]
    return statistics.median(values) if values else float("nan")


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cells: dict[tuple[str, str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["engines"], r["target"], r["workers"], r["size_words"]), []).append(r)
    out = []
    for (engines, target, workers, size), rs in cells.items():
        out.append({
            "engines": engines, "target": target, "workers": workers, "size_words": size,
            "reps": len(rs), "cpu_ms_per_req": _median(rs, "cpu_ms_per_req"),
            "cpu_ms_all": [round(r["cpu_ms_per_req"], 3) for r in rs],
            "req_per_s": _median(rs, "req_per_s"), "req_per_s_all": [round(r["req_per_s"]) for r in rs],
            "errors": sum(r["errors"] for r in rs),
        })  # fmt: skip
    return out


def write_report(args: argparse.Namespace, rows: list[dict[str, Any]], has_workers: bool) -> None:
    summary = summarise(rows)
    by = {(s["engines"], s["target"], s["workers"], s["size_words"]): s for s in summary}
    sizes = args.sizes
    lines = [
        "# Router CPU per request and requests/s on agentic bodies",
        "",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}; commit {commit()}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores (this machine has 2 cores, "
        f"shared with other engineers' work), {platform.platform()}, Python {platform.python_version()}",
        f"- command: `python -m benchmarks.router_cpu {' '.join(shlex.quote(a) for a in sys.argv[1:])}`",
        f"- {args.clients} clients in a closed loop, {args.seconds:g} s measured per cell after a "
        f"warm-up; medians of {args.reps} repetitions (all values in the JSON)",
        "- bodies: chat, a workflow's shared context (system message) + the agent's own message "
        f"(up to 300 words, new each request); {WORKFLOWS} workflows × {AGENTS} agents; headers "
        "X-Workflow-Id / X-Agent-Id",
        "- 1 worker: router pinned to core 1, engines and load generator on core 0; 2 workers: "
        "router on both cores (hiveroute: "
        + (
            "`serve --workers 2`"
            if has_workers
            else "two processes on two ports, clients split, "
            "as `serve --workers` does not exist yet"
        )
        + "), engines and load generator still on core 0",
        *(
            [
                f"- `base:POLICY`: hiveroute from {args.baseline} (commit "
                f"{os.environ.get('HIVEROUTE_BASE_COMMIT') or commit(Path(args.baseline))}), "
                "the same run, "
                + (
                    "at each worker count"
                    if source_has_workers(args.baseline)
                    else "1 worker (it predates `serve --workers`)"
                )
            ]
            if args.baseline
            else []
        ),
        "- peers at their default policy (`cache_aware`); smg 1.13.0 and sglang-router 0.3.2, each "
        "in its own venv (hiveroute.bench.peers)",
        "",
    ]
    for engines in ("instant", "sim"):
        names = [t for t in TARGETS if any(k[0] == engines and k[1] == t for k in by)]
        if not names:
            continue
        workers_list = sorted({k[2] for k in by if k[0] == engines})
        lines += [f"## {engines} engines", ""]
        if engines == "instant":
            lines.append("Two instant engines, no KV events (`kv` sees an empty index; "
                         "`workflow` uses its own decisions).")  # fmt: skip
        else:
            lines.append("`hiveroute sim --engines 2 --preset fast` with KV events; the simulator "
                         "tokenizes every prompt, so its requests/s bound the router's.")  # fmt: skip
        lines.append("")
        head = "| target | workers | " + " | ".join(
            f"{s // 1000}k words CPU ms/req | {s // 1000}k req/s" for s in sizes
        )
        lines += [head + " |", "|---|---:|" + "---:|---:|" * len(sizes)]
        for name in names:
            for workers in workers_list:
                cells = [by.get((engines, name, workers, s)) for s in sizes]
                if not any(cells):
                    continue
                parts = []
                for c in cells:
                    if c is None:
                        parts += ["-", "-"]
                        continue
                    cpu = c["cpu_ms_per_req"]
                    parts += ["-" if cpu != cpu else f"{cpu:.2f}", f"{c['req_per_s']:.0f}"]
                lines.append(f"| {name} | {workers} | " + " | ".join(parts) + " |")
        lines.append("")
        if len(workers_list) > 1:
            lines += ["Requests/s with 2 workers over 1 (same run):", ""]
            for name in names:
                if name == "direct" or TARGETS[name].source:
                    continue
                ratios = []
                for s in sizes:
                    one, two = by.get((engines, name, 1, s)), by.get((engines, name, 2, s))
                    if one and two and one["req_per_s"]:
                        ratios.append(f"{s // 1000}k {two['req_per_s'] / one['req_per_s']:.2f}×")
                lines.append(f"- {name}: " + ", ".join(ratios))
            lines.append("")
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = RESULTS / args.name
    old = report.with_suffix(".md").read_text() if report.with_suffix(".md").exists() else ""
    marker = "\n## Reading the figures"
    tail = old[old.index(marker) :] if marker in old else ""  # hand-kept findings and profiles stay
    report.with_suffix(".md").write_text("\n".join(lines) + tail)
    report.with_suffix(".json").write_text(
        json.dumps({"argv": sys.argv, "summary": summary, "rows": rows}, indent=1)
    )
    print("\n".join(lines))
    print(f"\nreport: {report.with_suffix('.md')}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", type=comma_ints, default="1000,4000,16000", help="body sizes in words"
    )
    parser.add_argument(
        "--targets", type=comma_list, default=",".join(TARGETS), help="on instant engines"
    )
    parser.add_argument("--sim-targets", type=comma_list, default="hiveroute:kv,hiveroute:workflow,smg",
                        help="on simulated engines with KV events ('' for none)")  # fmt: skip
    parser.add_argument("--baseline", default="", metavar="DIR",
                        help="also run hiveroute from this checkout (targets base:POLICY; at every worker count if it has serve --workers)")  # fmt: skip
    parser.add_argument(
        "--workers", type=comma_ints, default="1,2", help="worker counts (instant engines)"
    )
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per cell")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument("--bodies", type=int, default=256, help="distinct bodies per size")
    parser.add_argument("--quick", action="store_true", help="1 repetition of 2 s")
    parser.add_argument("--name", default="router_cpu", help="report name under benchmarks/results")
    parser.add_argument("--log-dir", default="/tmp/hiveroute-router-cpu")
    args = parser.parse_args()
    if args.baseline:
        for policy in ("round_robin", "kv", "workflow"):
            name = f"base:{policy}"
            TARGETS[name] = Target(name, "hiveroute", policy, str(Path(args.baseline).resolve()))
            current = f"hiveroute:{policy}"
            if current in args.targets:
                args.targets.insert(args.targets.index(current), name)
    for t in args.targets + args.sim_targets:
        if t not in TARGETS:
            parser.error(f"unknown target {t!r}; known: {', '.join(TARGETS)}")
    if args.quick:
        args.reps, args.seconds = 1, 2.0
    runtime.use_fastest_event_loop()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
