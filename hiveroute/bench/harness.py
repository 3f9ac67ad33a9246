"""A benchmark run: targets x workloads, interleaved in slices, written to one directory.

Every target gets its own engines (same kind, count and preset), so no target warms the cache
of another. The run is cut into slices; in each slice every (workload, target) cell runs its
share of the workload, targets in a rotating order, so a noisy neighbour on the machine hits all
targets alike instead of whichever happened to run last.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from hiveroute.bench import plots, router_lag
from hiveroute.bench.driver import CellRun, DriverOptions
from hiveroute.bench.engines import EngineOptions, Fleet, start_fleet
from hiveroute.bench.environment import describe_environment
from hiveroute.bench.loadsampler import LoadSampler
from hiveroute.bench.progress import ProgressBar
from hiveroute.bench.records import LoadSample, RequestRecord, UnitRecord
from hiveroute.bench.summary import (
    engine_cache_counts,
    engine_request_counts,
    engine_ttft_counts,
    markdown_table,
    summarize_cell,
)
from hiveroute.bench.targets import RunningTarget, TargetSpec, start_target
from hiveroute.bench.workloads import build_workload
from hiveroute.bench.workloads.base import Unit
from hiveroute.extras import install_hint


@dataclass
class RunOptions:
    targets: list[TargetSpec]
    workloads: list[str]
    workload_args: argparse.Namespace
    driver: DriverOptions
    engines: EngineOptions
    out_dir: Path
    slices: int = 1
    seed: int = 0
    name: str = "bench"
    command: list[str] = field(default_factory=list)
    quiet: bool = False
    router_log_level: str = "warning"  # of `hiveroute serve` targets; info logs each request
    router_replicas: int = 1  # router processes per target, requests sent to each in turn
    router_state: str = "memory"  # hiveroute targets' state store: memory, or a private Redis
    # How engines are started (tests substitute their own); default: `start_fleet`.
    fleet_factory: Callable[[EngineOptions, Path], Awaitable[Fleet]] | None = None


@dataclass
class RunResult:
    run_dir: Path
    cells: list[dict[str, Any]]
    table: str


@dataclass
class _Cell:
    target: str
    workload: str
    records: list[RequestRecord] = field(default_factory=list)
    units: list[UnitRecord] = field(default_factory=list)
    loads: list[LoadSample] = field(default_factory=list)
    wall_s: float = 0.0
    engine_hits: float = 0.0
    engine_queries: float = 0.0
    engine_ttft_sum: float = 0.0
    engine_ttft_count: float = 0.0
    engine_requests: dict[str, float] = field(default_factory=dict)
    router_cpu_s: float | None = 0.0  # None once a slice could not read it
    # the router's event-loop lag histogram, grown over the slices (None: not hiveroute, or
    # a slice could not read it)
    loop_lag: router_lag.Buckets | None = field(default_factory=dict)


def split_slices(units: list[Unit], slices: int) -> list[list[Unit]]:
    """Contiguous slices of about equal size, each one's arrivals starting at 0."""
    out: list[list[Unit]] = []
    n = len(units)
    for s in range(slices):
        part = units[s * n // slices : (s + 1) * n // slices]
        if part:
            base = part[0].arrival_s
            for unit in part:
                unit.arrival_s -= base
        out.append(part)
    return out


async def _model_of(http: aiohttp.ClientSession, url: str) -> str:
    try:
        async with http.get(url + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as r:
            data = await r.json(content_type=None)
            return str(data["data"][0]["id"])
    except (TimeoutError, aiohttp.ClientError, KeyError, IndexError, TypeError, ValueError):
        raise RuntimeError(f"{url}/v1/models lists no model") from None


async def run_benchmark(options: RunOptions) -> RunResult:
    started = datetime.now(UTC)
    run_dir = options.out_dir / f"{started:%Y%m%d-%H%M%S}-{options.name}"
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = options.out_dir / f"{started:%Y%m%d-%H%M%S}-{options.name}-{suffix}"
    logs = run_dir / "logs"
    logs.mkdir(parents=True)
    nonce = secrets.token_hex(3)

    # The same units for every target, but each target's prompts start with its own word.
    plans: dict[tuple[str, str], list[list[Unit]]] = {}
    described: dict[str, Any] = {}
    for ti, target in enumerate(options.targets):
        for workload_name in options.workloads:
            workload = build_workload(
                workload_name, options.workload_args, options.seed, f"run{nonce}t{ti}"
            )
            described[workload_name] = workload.describe()
            plans[(target.label, workload_name)] = split_slices(
                list(workload.units()), options.slices
            )

    fleets: list[Fleet] = []
    running: list[RunningTarget] = []
    cells = {key: _Cell(*key) for key in plans}
    run_t0 = time.perf_counter()
    try:
        for spec in options.targets:
            tag = spec.file_tag
            if spec.external:  # a running deployment: its engines are its own
                _say(options, f"using {spec.label}")
                fleet = Fleet(specs=[], urls=[], kind="external")
            else:
                _say(
                    options,
                    f"starting {options.engines.count} {options.engines.kind} engines and "
                    f"{spec.label}",
                )
                factory = options.fleet_factory or start_fleet
                fleet = await factory(options.engines, logs / f"engines-{tag}.log")
            fleets.append(fleet)
            running.append(
                await start_target(
                    spec,
                    fleet,
                    logs,
                    log_level=options.router_log_level,
                    replicas=options.router_replicas,
                    state=options.router_state,
                )
            )
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector) as http:
            # Ask the engines, not the target: SGLang's router answers /v1/models with its own
            # placeholder name ("unknown") for engines that lack SGLang's /model_info.
            # A running deployment's engines are unknown: ask the deployment itself.
            models = [
                await _model_of(http, fleet.urls[0] if fleet.urls else target.url)
                for fleet, target in zip(fleets, running, strict=True)
            ]
            slice_driver = DriverOptions(
                **{
                    **options.driver.__dict__,
                    "duration_s": options.driver.duration_s / options.slices,
                }
            )
            for s in range(options.slices):
                order = list(range(len(running)))
                order = order[s % len(order) :] + order[: s % len(order)]
                for workload_name in options.workloads:
                    for ti in order:
                        label = running[ti].spec.label
                        cell = cells[(label, workload_name)]
                        units = plans[(label, workload_name)][s]
                        await _run_slice(
                            http,
                            cell,
                            running[ti],
                            fleets[ti],
                            models[ti],
                            units,
                            slice_driver,
                            options,
                            f"{label} {workload_name} {s + 1}/{options.slices}",
                            lambda: time.perf_counter() - run_t0,
                        )
    finally:
        for live in running:
            await live.stop()
        for fleet in fleets:
            await fleet.stop()

    summaries = []
    for cell in cells.values():
        summary = summarize_cell(
            cell.records,
            cell.units,
            cell.wall_s,
            (cell.engine_hits, cell.engine_queries),
            (cell.engine_ttft_sum, cell.engine_ttft_count),
            cell.router_cpu_s,
            cell.loop_lag or None,
        )
        summary["engine_requests"] = dict(sorted(cell.engine_requests.items()))
        summaries.append({"target": cell.target, "workload": cell.workload, **summary})
    table = markdown_table(summaries)
    meta = {
        "started_utc": started.isoformat(timespec="seconds"),
        "finished_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": options.command,
        "environment": describe_environment(),
        "targets": [t.label for t in options.targets],
        "workloads": described,
        "engines": options.engines.__dict__,
        "driver": options.driver.__dict__,
        "slices": options.slices,
        "seed": options.seed,
        "router_replicas": options.router_replicas,
        "router_state": options.router_state,
    }
    _write(run_dir, cells, summaries, table, meta, options.workloads)
    return RunResult(run_dir, summaries, table)


async def _run_slice(
    http: aiohttp.ClientSession,
    cell: _Cell,
    target: RunningTarget,
    fleet: Fleet,
    model: str,
    units: list[Unit],
    driver: DriverOptions,
    options: RunOptions,
    label: str,
    clock: Any,
) -> None:
    if not units:
        return
    bar = None
    if not options.quiet:
        bar = ProgressBar(label, sum(u.planned_requests for u in units))
    run = CellRun(
        http,
        target.urls,
        model,
        target=cell.target,
        workload=cell.workload,
        options=driver,
        progress=bar,
    )
    lag_before = await _loop_lag(http, cell, target)
    started = time.perf_counter()
    cpu_before = target.cpu_seconds()
    async with LoadSampler(http, fleet.urls, clock) as sampler:
        await run.run(units)
    cpu_after = target.cpu_seconds()
    lag_after = await _loop_lag(http, cell, target)
    if cell.loop_lag is not None and lag_before is not None and lag_after is not None:
        router_lag.add(cell.loop_lag, router_lag.growth(lag_before, lag_after))
    else:
        cell.loop_lag = None
    cell.wall_s += time.perf_counter() - started
    if cell.router_cpu_s is not None and cpu_before is not None and cpu_after is not None:
        cell.router_cpu_s += cpu_after - cpu_before
    else:
        cell.router_cpu_s = None
    if bar is not None:
        bar.close()
    cell.records.extend(run.records)
    cell.units.extend(run.units)
    cell.loads.extend(sampler.samples)
    hits, queries = engine_cache_counts(sampler.samples)  # per slice: others ran in between
    cell.engine_hits += hits
    cell.engine_queries += queries
    ttft_sum, ttft_count = engine_ttft_counts(sampler.samples)
    cell.engine_ttft_sum += ttft_sum
    cell.engine_ttft_count += ttft_count
    for engine, done in engine_request_counts(sampler.samples).items():
        cell.engine_requests[engine] = cell.engine_requests.get(engine, 0.0) + done


async def _loop_lag(
    http: aiohttp.ClientSession, cell: _Cell, target: RunningTarget
) -> router_lag.Buckets | None:
    """The router's lag buckets now, for a hiveroute router the harness started."""
    if cell.loop_lag is None or not target.spec.is_hiveroute or target.spec.external:
        return None
    return await router_lag.read_buckets(http, target.urls)


def _say(options: RunOptions, text: str) -> None:
    if not options.quiet:
        import sys

        print(text, file=sys.stderr, flush=True)


def _write(
    run_dir: Path,
    cells: dict[tuple[str, str], _Cell],
    summaries: list[dict[str, Any]],
    table: str,
    meta: dict[str, Any],
    workloads: list[str],
) -> None:
    with (run_dir / "requests.jsonl").open("w") as f:
        for cell in cells.values():
            for r in cell.records:
                f.write(json.dumps(r.to_json()) + "\n")
    with (run_dir / "units.jsonl").open("w") as f:
        for cell in cells.values():
            for u in cell.units:
                f.write(json.dumps(u.to_json()) + "\n")
    with (run_dir / "load.jsonl").open("w") as f:
        for cell in cells.values():
            for s in cell.loads:
                f.write(json.dumps({"target": cell.target, **s.to_json()}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({**meta, "cells": summaries}, indent=2))
    records = [r for cell in cells.values() for r in cell.records]
    if plots.available():
        plots.ttft_cdf(records, workloads, run_dir / "ttft_cdf.png")
        plots.hit_rate(summaries, run_dir / "hit_rate.png")
        plots.engine_load(
            [(cell.target, s) for cell in cells.values() for s in cell.loads],
            run_dir / "engine_load.png",
        )
        images = (
            "![TTFT CDF](ttft_cdf.png) ![hit rate](hit_rate.png) ![engine load](engine_load.png)"
        )
    else:
        images = f"(No plots: matplotlib is not installed; {install_hint('bench')} adds them.)"
    env = meta["environment"]
    lines = [
        f"# hiveroute bench: {', '.join(meta['targets'])} × {', '.join(workloads)}",
        "",
        f"- date (UTC): {meta['started_utc']} – {meta['finished_utc']}",
        f"- machine: {env.get('cpu_model')} × {env.get('cpu_count')} CPUs, {env.get('platform')}",
        f"- hiveroute: {env.get('git_commit') or 'unknown commit'}; Python {env.get('python')}",
        f"- engines: {meta['engines']['count']} × {meta['engines']['kind']} "
        f"({_engine_shape(meta['engines'])}) per target; slices: {meta['slices']}",
        f"- command: `{shlex.join(meta['command'])}`",
        "",
        table,
        "",
        "TTFT, TPOT (time per output token) and e2e are per request; *workflow* is a unit's "
        "completion time (a workflow, a chat session, or one trace request); *hand-off* is from "
        "the last token of the step(s) a request depends on to its own first token, minus the "
        "planned tool or think time; *hit rate* is cached / prompt tokens from `usage`.",
        "",
        images,
        "",
        "Files: `requests.jsonl` (one line per request), `units.jsonl`, `load.jsonl`, "
        "`summary.json`, `logs/`.",
    ]
    (run_dir / "report.md").write_text("\n".join(lines) + "\n")


def _engine_shape(engines: dict[str, Any]) -> str:
    """What the engines model: a simulator preset, or the real model vLLM serves."""
    if engines.get("kind") == "vllm":
        return f"random-weight Llama {engines.get('vllm_layers')}x{engines.get('vllm_hidden')}"
    return f"preset {engines.get('preset')}"
