"""One router in two matrix result directories, cell by cell: the same policy under two setups
(1 and 2 router workers, say), judged by the matrix's own tie rule.

    PYTHONPATH=. python -m benchmarks.matrix.compare --router hiveroute:workflow \
        --a benchmarks/results/matrix --a-label "1 worker" \
        --b /tmp/w2/res --b-label "2 workers" --name workers_matrix

Per cell and metric, each side's figure is the median of its seeds and its spread their range;
the sides tie when their medians are within the larger spread (`verdict.classify`), else the
better one wins. A side with one seed has no spread of its own, so the other side's spread
decides; figures that print alike (within half the report's last digit) tie. Cells present on
both sides only. A second table pairs the runs by seed (one workload on both sides): a cell's
range from seed to seed can hide a change that is worse in most of its seeds. Writes
benchmarks/results/NAME.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks.matrix.store import CellStore
from benchmarks.matrix.verdict import METRICS, Figure, classify, figures
from benchmarks.report import publish

COMPARED = (
    "hit_rate",
    "ttft_mean",
    "ttft_p99",
    "tpot_mean",
    "downstream_ttft_mean",
    "workflow_s_mean",
    "router_cpu_ms",
)
# half the report's last digit: figures that print alike tie whatever their seeds
RESOLUTION = {
    "hit_rate": 0.0005,
    "tpot_mean": 0.000005,  # printed in hundredths of a ms
    "workflow_s_mean": 0.005,
    "router_cpu_ms": 0.05,
}
RESOLUTION_S = 0.0005  # TTFTs, printed in whole ms


def side(cell: Mapping[str, Any], router: str, metric: str) -> Figure | None:
    return figures(cell, metric).get(router)


def compare_cell(
    a: Mapping[str, Any], b: Mapping[str, Any], router: str
) -> dict[str, tuple[Figure, Figure, str]]:
    """metric -> (a's figure, b's figure, what b did against a: better | tied | worse)."""
    out = {}
    for metric in COMPARED:
        fa, fb = side(a, router, metric), side(b, router, metric)
        if fa is None or fb is None:
            continue
        floor = RESOLUTION.get(metric, RESOLUTION_S)
        wide = {k: replace(f, spread=max(f.spread, floor)) for k, f in (("a", fa), ("b", fb))}
        verdict = classify(wide, METRICS[metric])["b"]
        out[metric] = (fa, fb, {"won": "better", "tied": "tied", "lost": "worse"}[verdict])
    return out


def paired(
    a: Mapping[str, Any], b: Mapping[str, Any], router: str, metric: str
) -> list[tuple[int, float, float]]:
    """(seed, a's value, b's value) for every seed both sides ran ok: a seed is the same
    workload on both sides, so its difference is the change's, not the workload's."""

    def by_seed(cell: Mapping[str, Any]) -> dict[int, float]:
        return {
            r["seed"]: r[metric]
            for r in cell.get("runs", {}).values()
            if r.get("router") == router and r.get("status") == "ok" and r.get(metric) is not None
        }

    sa, sb = by_seed(a), by_seed(b)
    return [(seed, sa[seed], sb[seed]) for seed in sorted(sa.keys() & sb.keys())]


def paired_row(name: str, a: Mapping[str, Any], b: Mapping[str, Any], router: str) -> str | None:
    """One cell's paired verdicts: per metric, in how many seeds b did better, and the median
    of b's value over a's."""
    cells = []
    seeds = 0
    for metric in COMPARED:
        pairs = paired(a, b, router, metric)
        if not pairs:
            cells.append("–")
            continue
        seeds = max(seeds, len(pairs))
        higher = METRICS[metric]
        better = sum((vb > va) if higher else (vb < va) for _, va, vb in pairs)
        ratios = [vb / va for _, va, vb in pairs if va]  # a hit rate of 0 has no ratio
        ratio = f", ×{median(ratios):.3f}" if ratios else ""
        cells.append(f"{better} of {len(pairs)}{ratio}")
    if not seeds:
        return None
    return f"| {name} | " + " | ".join(cells) + " |"


def _fmt(metric: str, fig: Figure) -> str:
    if metric == "hit_rate":
        return f"{100 * fig.median:.1f}% ±{50 * fig.spread:.1f}"
    if metric == "router_cpu_ms":
        return f"{fig.median:.1f} ±{fig.spread / 2:.1f}"
    if metric == "tpot_mean":
        return f"{1000 * fig.median:.2f} ±{500 * fig.spread:.2f}"
    scale, unit = (1.0, " s") if metric == "workflow_s_mean" else (1000.0, "")
    return (
        f"{scale * fig.median:.{2 if unit else 0}f} ±{scale * fig.spread / 2:.{2 if unit else 0}f}"
    )


def report(router: str, a: Path, b: Path, a_label: str = "a", b_label: str = "b") -> str:
    """The comparison of `router`'s runs in result directories `a` and `b`, as markdown."""
    a_store, b_store = CellStore(a), CellStore(b)
    names = sorted(p.stem for p in b.glob("*.json") if a_store.path(p.stem).exists())
    tallies = {m: {"better": 0, "tied": 0, "worse": 0} for m in COMPARED}
    rows = []
    pairs = []
    for name in names:
        a_cell, b_cell = a_store.load(name), b_store.load(name)
        pair = paired_row(name, a_cell, b_cell, router)
        if pair is not None:
            pairs.append(pair)
        compared = compare_cell(a_cell, b_cell, router)
        if not compared:
            continue
        cells = []
        for metric in COMPARED:
            if metric not in compared:
                cells.append("–")
                continue
            fa, fb, verdict = compared[metric]
            tallies[metric][verdict] += 1
            mark = {"better": " **better**", "worse": " **worse**", "tied": ""}[verdict]
            cells.append(f"{_fmt(metric, fa)} → {_fmt(metric, fb)}{mark}")
        fa, fb, _ = next(iter(compared.values()))
        seeds = f"{fa.seeds}/{fb.seeds}"
        rows.append(f"| {name} | {seeds} | " + " | ".join(cells) + " |")
    lines = [
        f"`{router}`: {a_label} (`{a}`) → {b_label} (`{b}`); "
        "medians of seeds ± half their range; **better** / **worse**: outside the larger "
        "spread (the matrix's tie rule), else tied. TTFT and TPOT (time per output token) "
        "in ms, workflow time in s, the router's CPU in ms per request.",
        "",
        "| metric | better | tied | worse |",
        "|---|---:|---:|---:|",
    ]
    for metric in COMPARED:
        t = tallies[metric]
        if sum(t.values()):
            lines.append(f"| {metric} | {t['better']} | {t['tied']} | {t['worse']} |")
    lines += [
        "",
        "| cell | seeds | " + " | ".join(COMPARED) + " |",
        "|---|---|" + "---|" * len(COMPARED),
        *rows,
        "",
        f"Paired by seed (a seed is one workload on both sides): in how many seeds {b_label} "
        f"did better than {a_label}, and the median of its figure over theirs.",
        "",
        "| cell | " + " | ".join(COMPARED) + " |",
        "|---|" + "---|" * len(COMPARED),
        *pairs,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.matrix.compare", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--router", default="hiveroute:workflow")
    parser.add_argument("--a", required=True, help="the reference results directory")
    parser.add_argument("--b", required=True, help="the compared results directory")
    parser.add_argument("--a-label", default="a")
    parser.add_argument("--b-label", default="b")
    parser.add_argument("--name", default="matrix_compare")
    parser.add_argument("--title", default="One router in two matrix result sets")
    args = parser.parse_args(argv)
    publish(
        args.name,
        args.title,
        report(args.router, Path(args.a), Path(args.b), args.a_label, args.b_label),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
