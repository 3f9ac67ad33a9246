"""Issue 6's comparison: routing policies on the agentic workload, per agent role.

    python benchmarks/workflow_policies.py [--quick] [any `hiveroute bench compare` option]

Runs `hiveroute bench compare` (targets default to round_robin, session, kv and workflow on 4
simulated engines), then reads the run's requests.jsonl for what the issue asks beyond the
bench's own table: TTFT mean/p50/p99 per agent role, downstream agents' mean TTFT (executors
and validator: every request after a workflow's first) and its ratio to round_robin, and the
cross-agent hit rate, scraped from each hiveroute router's own /metrics just before it stops
(hiveroute_cross_agent_cached_tokens_total over hiveroute_workflow_prompt_tokens_total).
Prints the tables and writes benchmarks/results/workflow_policies.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_TARGETS = [
    "hiveroute:round_robin",
    "hiveroute:session",
    "hiveroute:kv",
    "hiveroute:workflow",
]
# Many concurrent workflows, fan-out 6, a 16k-token shared context, tool gaps of seconds, and
# engines whose KV cache holds only a few workflows' contexts at once (so placement matters).
DEFAULT_WORKLOAD = [
    "--num-engines", "4", "--workflows", "24", "--workflow-rate", "1.0", "--fan-out", "6",
    "--rounds", "3", "--kb-tokens", "16000", "--tool-gap", "exp:2", "--slices", "1",
    "--sim-option", "num_blocks=8000",
]  # fmt: skip
QUICK_WORKLOAD = [
    "--num-engines", "4", "--workflows", "8", "--workflow-rate", "1.0", "--fan-out", "4",
    "--rounds", "2", "--kb-tokens", "8000", "--tool-gap", "exp:1", "--slices", "1",
    "--sim-option", "num_blocks=4000",
]  # fmt: skip

_SERIES = re.compile(r'^(hiveroute_[a-z_]+_total)\{engine="[^"]*"\} ([0-9.e+]+)$', re.M)
_REASONS = re.compile(
    r'^hiveroute_routing_decisions_total\{policy="[^"]*",reason="([^"]*)"\} ([0-9.e+]+)$', re.M
)
_WARM = re.compile(
    r'^hiveroute_keep_warm_requests_total\{engine="[^"]*",kind="([^"]*)",result="[^"]*"\} '
    r"([0-9.e+]+)$",
    re.M,
)
scraped: dict[str, dict[str, float]] = {}


def _install_metrics_scrape() -> None:
    """Read each hiveroute router's /metrics just before the harness stops it."""
    from hiveroute.bench import targets

    original = targets.RunningTarget.stop

    async def stop(self: Any) -> None:
        if self.spec.kind.startswith("hiveroute"):
            try:
                async with aiohttp.ClientSession() as http, http.get(self.url + "/metrics") as r:
                    text = await r.text()
                totals: dict[str, float] = defaultdict(float)
                for name, value in _SERIES.findall(text):
                    totals[name] += float(value)
                for reason, value in _REASONS.findall(text):
                    totals[f"reason:{reason}"] += float(value)
                for kind, value in _WARM.findall(text):
                    totals[f"keep_warm:{kind}"] += float(value)
                scraped[self.spec.label] = dict(totals)
            except aiohttp.ClientError:
                pass
        await original(self)

    targets.RunningTarget.stop = stop  # type: ignore[method-assign]


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def analyse(run_dir: Path) -> dict[str, Any]:
    by_target: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in (run_dir / "requests.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_target[record["target"]].append(record)
    summary = json.loads((run_dir / "summary.json").read_text())
    cells = {c["target"]: c for c in summary["cells"]}
    result: dict[str, Any] = {}
    for target, records in by_target.items():
        ok = [r for r in records if r["status"] == 200 and r["ttft_s"] is not None]
        first_of_unit: dict[str, float] = {}
        for r in ok:
            first_of_unit[r["unit_id"]] = min(first_of_unit.get(r["unit_id"], 1e18), r["t_send_s"])
        roles: dict[str, list[float]] = defaultdict(list)
        downstream: list[float] = []
        for r in ok:
            roles[r.get("agent_role") or "-"].append(r["ttft_s"])
            if r["t_send_s"] > first_of_unit[r["unit_id"]]:
                downstream.append(r["ttft_s"])
        metrics = scraped.get(target, {})
        cross = metrics.get("hiveroute_cross_agent_cached_tokens_total")
        prompt = metrics.get("hiveroute_workflow_prompt_tokens_total")
        cell = cells.get(target, {})
        result[target] = {
            "requests": len(records),
            "errors": len(records) - len(ok),
            "roles": {role: _role_stats(v) for role, v in sorted(roles.items())},
            "downstream_ttft_mean_ms": _ms(_mean(downstream)),
            "workflow_s_mean": cell.get("unit_s_mean"),
            "workflow_s_p50": cell.get("unit_s_p50"),
            "hit_rate": cell.get("hit_rate"),
            "cross_agent_hit_rate": (cross / prompt) if cross is not None and prompt else None,
            "requests_per_engine": cell.get("requests_per_engine"),
            "decisions": {k[7:]: int(v) for k, v in metrics.items() if k.startswith("reason:")},
            "keep_warm": {k[10:]: int(v) for k, v in metrics.items() if k.startswith("keep_warm:")},
        }
    base = result.get("hiveroute:round_robin", {}).get("downstream_ttft_mean_ms")
    for row in result.values():
        mine = row["downstream_ttft_mean_ms"]
        row["downstream_speedup_vs_round_robin"] = (base / mine) if base and mine else None
    return result


def _role_stats(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "mean_ms": _ms(_mean(values)),
        "p50_ms": _ms(_pct(values, 0.5)),
        "p99_ms": _ms(_pct(values, 0.99)),
    }


def _ms(value: float | None) -> float | None:
    return round(value * 1000, 1) if value is not None else None


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def _balance(per_engine: dict[str, int] | None) -> str:
    if not per_engine:
        return "-"
    counts = sorted(per_engine.values(), reverse=True)
    return f"{max(counts) / (sum(counts) / len(counts)):.2f} ({'/'.join(map(str, counts))})"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| target | workflow mean s | workflow p50 s | downstream TTFT mean ms | vs round_robin "
        "| hit rate | cross-agent hit rate | busiest engine / mean (requests) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for target, row in result.items():
        lines.append(
            f"| {target} | {_fmt(row['workflow_s_mean'], '.2f')} | "
            f"{_fmt(row['workflow_s_p50'], '.2f')} | {_fmt(row['downstream_ttft_mean_ms'])} | "
            f"{_fmt(row['downstream_speedup_vs_round_robin'], '.2f')}x | "
            f"{_fmt(row['hit_rate'], '.1%')} | {_fmt(row['cross_agent_hit_rate'], '.1%')} | "
            f"{_balance(row['requests_per_engine'])} | {row['errors']} |"
        )
    lines += ["", "Routing decisions and keep-warm requests (from each router's /metrics)", ""]
    for target, row in result.items():
        decisions = ", ".join(f"{k} {v}" for k, v in sorted(row["decisions"].items()))
        warm = ", ".join(f"{k} {v}" for k, v in sorted(row["keep_warm"].items())) or "none"
        lines.append(f"- {target}: {decisions or '-'}; keep-warm: {warm}")
    lines += ["", "TTFT per agent role (ms): mean / p50 / p99", ""]
    roles = sorted({role for row in result.values() for role in row["roles"]})
    lines.append("| target | " + " | ".join(roles) + " |")
    lines.append("|---|" + "---:|" * len(roles))
    for target, row in result.items():
        cells = []
        for role in roles:
            r = row["roles"].get(role)
            cells.append(f"{r['mean_ms']} / {r['p50_ms']} / {r['p99_ms']}" if r else "-")
        lines.append(f"| {target} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run (about a minute)")
    ours, rest = parser.parse_known_args(argv)
    from hiveroute.bench.command import execute, options_from_args
    from hiveroute.cli import build_parser

    extra = list(QUICK_WORKLOAD if ours.quick else DEFAULT_WORKLOAD)
    if "--target" not in rest:
        for target in DEFAULT_TARGETS:
            extra += ["--target", target]
    bench_argv = ["bench", "compare", "--name", "workflow-policies", "--quiet", *extra, *rest]
    args = build_parser().parse_args(bench_argv)
    _install_metrics_scrape()
    run = execute(options_from_args(args, ["hiveroute", *bench_argv]))
    result = analyse(run.run_dir)
    table = markdown(result)
    print(run.table)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/workflow_policies.py " + " ".join(argv)
    meta = json.loads((run.run_dir / "summary.json").read_text())
    env = meta["environment"]
    header = (
        f"# Routing policies on the agentic workload (issue 6)\n\n"
        f"- date (UTC): {meta['started_utc']} – {meta['finished_utc']}\n"
        f"- machine: {env['cpu_model']} × {env['cpu_count']} CPUs, {env['platform']}\n"
        f"- engines: {meta['engines']['count']} × {meta['engines']['kind']} "
        f"(preset {meta['engines']['preset']}, {meta['engines']['sim_options']})\n"
        f"- workload: {json.dumps(meta['workloads'].get('agentic', {}))}\n"
        f"- command: `{command}` (runs `hiveroute {' '.join(bench_argv)}`)\n"
        f"- raw run: {run.run_dir}\n\n"
    )
    name = "workflow_policies_quick" if ours.quick else "workflow_policies"
    (RESULTS / f"{name}.md").write_text(header + run.table + "\n\n" + table + "\n")
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "result": result}, indent=1))
    print(f"wrote {RESULTS / name}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
