"""Running one (cell, router, seed): `hiveroute bench run` on a fresh fleet, reduced to the
figures the matrix compares."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks.matrix.grid import Cell, fleet_args, workload_args
from benchmarks.matrix.verdict import IDEAL
from hiveroute.bench import environment

ROUTERS = (
    "hiveroute:workflow",
    "hiveroute:kv",
    "hiveroute:prefix",
    "hiveroute:round_robin",
    "smg",
    "sglang",
    "vllm-router",
)
REFS = "+refs"  # a hiveroute router with the shared context registered and referenced
DOWNSTREAM_ROLES = ("executor", "validator")  # agents that start from another's hand-off


def plan(cell: Cell, routers: list[str], *, refs: bool = True, ideal: bool = True) -> list[str]:
    """The routers a cell runs: the given ones; in role-first agentic cells, hiveroute:workflow
    also with its context referenced (REFS); where the working set fits (and one replica: the
    ideal has no router to replicate), the one-cache ideal."""
    out = [r for r in routers if not r.endswith(REFS) or cell.role_first]
    with_refs = "hiveroute:workflow" + REFS
    single = cell.replicas == 1
    if refs and cell.role_first and "hiveroute:workflow" in routers and with_refs not in out:
        out.append(with_refs)
    if ideal and cell.fits and single and IDEAL not in out:
        out.append(IDEAL)
    return out


def harness_argv(
    cell: Cell,
    router: str,
    seed: int,
    time_scale: float,
    out: Path,
    log_level: str = "warning",
) -> list[str]:
    """`hiveroute bench run` arguments for one run (`log_level`: hiveroute routers'; `info`
    keeps every decision in the run's logs/target-*.log)."""
    name = f"{cell.name}-{router.replace(':', '-').replace('+', '-')}-s{seed}"
    argv = ["run", "--quiet", "--out", str(out), "--name", name]
    argv += ["--router-log-level", log_level]
    if router == IDEAL:
        argv += ["--target", "engine", *fleet_args(cell, time_scale, ideal=True)]
    else:
        argv += ["--target", router.removesuffix(REFS), *fleet_args(cell, time_scale)]
        if router.endswith(REFS):
            argv.append("--context-refs")
        if cell.replicas > 1:
            argv += ["--router-replicas", str(cell.replicas)]
            if router.endswith(REFS):  # a context registered with one replica, used at all
                argv += ["--router-state", "redis"]
    return argv + workload_args(cell, time_scale, seed)


def figures_of(summary: dict[str, Any], requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures kept per run, from the harness's cell summary and request records."""
    downstream = [
        r["ttft_s"]
        for r in requests
        if r.get("agent_role") in DOWNSTREAM_ROLES
        and not r.get("cut")
        and r.get("error") is None
        and r.get("ttft_s") is not None
    ]
    engines = summary.get("engine_requests") or {}
    return {
        "requests": summary.get("requests"),
        "ok": summary.get("ok"),
        "errors": summary.get("errors"),
        "cut": summary.get("cut"),
        "error_examples": summary.get("error_examples", []),
        "hit_rate": summary.get("hit_rate"),
        "ttft_mean": summary.get("ttft_s_mean"),
        "ttft_p50": summary.get("ttft_s_p50"),
        "ttft_p99": summary.get("ttft_s_p99"),
        # time per output token after the first: what a placement costs the requests already
        # decoding where it prefills (a judge of TTFT alone would miss it)
        "tpot_mean": summary.get("tpot_s_mean"),
        # the engines' own mean TTFT (their histograms): ttft_mean minus this is the router's
        "engine_ttft_mean": summary.get("engine_ttft_s_mean"),
        # the router's processes' CPU per request sent (None for runs made before it was read)
        "router_cpu_ms": summary.get("router_cpu_ms_per_request"),
        # how late the router's event loop ran, p99 (hiveroute only): the wait a request met
        # inside the router before it was read
        "router_loop_lag_ms_p99": summary.get("router_loop_lag_ms_p99"),
        "engine_requests": [round(engines[k]) for k in sorted(engines)],
        "downstream_ttft_mean": mean(downstream) if downstream else None,
        "workflow_s_mean": summary.get("unit_s_mean")
        if summary.get("workload") == "agentic"
        else None,
        "units_completed": summary.get("units_completed"),
        "wall_s": summary.get("wall_s"),
    }


def run_one(
    cell: Cell, router: str, seed: int, time_scale: float, out: Path, log_level: str = "warning"
) -> dict[str, Any]:
    """Run it; a failure (a router that does not start, say) is a result with its error."""
    from hiveroute.bench.command import configure, execute, options_from_args
    from hiveroute.errors import ConfigError

    argv = harness_argv(cell, router, seed, time_scale, out, log_level)
    parser = argparse.ArgumentParser(prog="hiveroute bench")
    configure(parser)
    try:
        result = execute(options_from_args(parser.parse_args(argv), ["hiveroute", "bench", *argv]))
    except (RuntimeError, ConfigError, OSError) as exc:
        return {"status": "failed", "error": str(exc), "command": argv}
    summary = result.cells[0]
    requests = [
        json.loads(line) for line in (result.run_dir / "requests.jsonl").read_text().splitlines()
    ]
    figures = figures_of(summary, requests)
    status = "ok" if figures["ok"] else "failed"
    return {
        "status": status,
        "run_dir": str(result.run_dir),
        "command": argv,
        "commit": git_commit(),
        **figures,
    }


def git_commit() -> str | None:
    """The commit the run measured, "+dirty" if the router's or the matrix's code had changes."""
    return environment.git_commit(dirty_paths=("hiveroute", "benchmarks/matrix"))
