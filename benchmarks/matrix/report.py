"""benchmarks/results/matrix.md: per-cell table, won/tied/lost per router, targets, plots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.matrix.verdict import DEFAULT, IDEAL, Check, figures, tally, targets

TALLY_METRICS = ("hit_rate", "ttft_mean", "ttft_p99", "tpot_mean", "downstream_ttft_mean")


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{1000 * v:.0f}"


def _ms2(v: float | None) -> str:
    return "–" if v is None else f"{1000 * v:.2f}"


def _s(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def _cpu(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def _median_of(cell: Mapping[str, Any], router: str, metric: str) -> float | None:
    fig = figures(cell, metric).get(router)
    return None if fig is None else fig.median


def _spread(cell: Mapping[str, Any], router: str, metric: str, fmt: Any) -> str:
    fig = figures(cell, metric).get(router)
    if fig is None:
        return "–"
    if fig.seeds < 2:
        return fmt(fig.median)
    return f"{fmt(fig.median)} ±{fmt(fig.spread / 2).lstrip('–')}"


def cell_table(cells: Sequence[Mapping[str, Any]]) -> str:
    head = (
        "| cell | router | seeds ok | hit rate | TTFT mean ms | engine TTFT ms | TTFT p50 ms | "
        "TTFT p99 ms | TPOT ms | requests per engine | errors | downstream TTFT ms | "
        "workflow s | router CPU ms/req |"
    )
    lines = [head, "|" + "---|" * 2 + "---:|" * 12]
    for cell in cells:
        routers = sorted({r["router"] for r in cell["runs"].values()}, key=_router_order)
        for router in routers:
            runs = [r for r in cell["runs"].values() if r["router"] == router]
            ok = [r for r in runs if r.get("status") == "ok"]
            per_engine = " / ".join(
                "-".join(str(c) for c in r.get("engine_requests") or []) for r in ok
            )
            errors = sum(r.get("errors") or 0 for r in ok) + sum(1 for r in runs if r not in ok)
            lines.append(
                f"| {cell['cell']} | {router} | {len(ok)}/{len(runs)} | "
                f"{_spread(cell, router, 'hit_rate', _pct)} | "
                f"{_spread(cell, router, 'ttft_mean', _ms)} | "
                f"{_ms(_median_of(cell, router, 'engine_ttft_mean'))} | "
                f"{_ms(_median_of(cell, router, 'ttft_p50'))} | "
                f"{_spread(cell, router, 'ttft_p99', _ms)} | "
                f"{_spread(cell, router, 'tpot_mean', _ms2)} | {per_engine or '–'} | {errors} | "
                f"{_ms(_median_of(cell, router, 'downstream_ttft_mean'))} | "
                f"{_s(_median_of(cell, router, 'workflow_s_mean'))} | "
                f"{_cpu(_median_of(cell, router, 'router_cpu_ms'))} |"
            )
    return "\n".join(lines)


def _router_order(router: str) -> tuple[int, str]:
    if router == IDEAL:
        return (3, router)
    return (0 if router.startswith("hiveroute") else 1, router)


def tally_table(cells: Sequence[Mapping[str, Any]]) -> str:
    counts = {m: tally(cells, m) for m in TALLY_METRICS}
    routers = sorted({r for c in counts.values() for r in c}, key=_router_order)
    head = "| router | " + " | ".join(f"{m} won/tied/lost" for m in TALLY_METRICS) + " |"
    lines = [head, "|---|" + "---:|" * len(TALLY_METRICS)]
    for router in routers:
        row = []
        for m in TALLY_METRICS:
            c = counts[m].get(router)
            row.append("–" if c is None else f"{c['won']}/{c['tied']}/{c['lost']}")
        lines.append(f"| {router} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def targets_table(checks: Sequence[Check]) -> str:
    lines = ["| target | met | cells judged | cells that miss it |", "|---|---|---:|---|"]
    for c in checks:
        met = "–" if c.met is None else ("yes" if c.met else "**no**")
        detail = "; ".join(c.misses) or "none"
        if not c.judged:
            detail = "no cell to judge (runs missing)"
        elif c.detail:
            detail = f"{c.detail}; misses: {detail}"
        lines.append(f"| {c.target} | {met} | {c.judged} | {detail} |")
    return "\n".join(lines)


def plots(cells: Sequence[Mapping[str, Any]], out: Path) -> list[str]:
    """Hit rate and TTFT mean per cell and router (medians), and the won/tied/lost tally."""
    from hiveroute.bench.plots import _pyplot

    plt = _pyplot()
    names = [c["cell"] for c in cells]
    routers = sorted({r["router"] for c in cells for r in c["runs"].values()}, key=_router_order)
    written = []
    for metric, label, scale in (
        ("hit_rate", "hit rate", 1.0),
        ("ttft_mean", "TTFT mean (ms)", 1000.0),
    ):
        fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(names) * max(1, len(routers)) / 3), 4.5))
        width = 0.8 / max(1, len(routers))
        highest = 0.0
        for i, router in enumerate(routers):
            ys = [(_median_of(c, router, metric) or 0.0) * scale for c in cells]
            highest = max(highest, *ys)
            ax.bar([x + i * width for x in range(len(names))], ys, width, label=router)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))])
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(label)
        if metric == "ttft_mean" and highest > 0:
            ax.set_yscale("log")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = out / f"matrix_{metric}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path.name)
    counts = tally(cells, "ttft_mean")
    if counts:
        contestants = sorted(counts, key=_router_order)
        fig, ax = plt.subplots(figsize=(8, 3.5))
        bottom = [0] * len(contestants)
        for verdict, colour in (("won", "tab:green"), ("tied", "tab:olive"), ("lost", "tab:red")):
            ys = [counts[r][verdict] for r in contestants]
            ax.bar(contestants, ys, bottom=bottom, color=colour, label=verdict)
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
        ax.set_ylabel("cells (TTFT mean)")
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / "matrix_won_tied_lost.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path.name)
    return written


def build(cells: Sequence[Mapping[str, Any]], engines: int, out: Path, header: str) -> str:
    """The report's body (after `write_report`'s date, machine and command)."""
    checks = targets(cells, engines, DEFAULT)
    images = plots(cells, out) if cells else []
    parts = [
        header,
        "## Targets (default policy `hiveroute:workflow` against the best peer, medians of seeds)",
        targets_table(checks),
        "## Cells won / tied / lost per router",
        "Per cell and metric: the best median wins alone unless another router's median is "
        "within the larger of the two routers' seed spreads (max − min) of it; then all such "
        "routers tie; the rest lose. `ideal` (one engine with the fleet's cache, 4× faster) is "
        "a reference, not a contestant. Metrics: "
        + ", ".join(f"`{m}`" for m in TALLY_METRICS)
        + ".",
        tally_table(cells),
        "## Per cell (medians of seeds; ± half the seeds' range)",
        "`requests per engine`: each run's requests finished per engine, by the engines' own "
        "counters, runs separated by ` / `. `downstream TTFT`: mean TTFT of executors and "
        "validators (agents that start from another's hand-off). `engine TTFT`: the engines' "
        "own mean TTFT (their TTFT histograms, over the runs that recorded it: those from "
        "2026-12-03 12:15 UTC on); `TTFT mean` minus it is what the router, the client and the "
        "HTTP hops added, so a router's placement (engine TTFT) and its own time separate. "
        "`TPOT`: mean time per output token after the first, as the client saw it (runs from "
        "2026-12-07 on): what a placement costs the requests decoding where it prefills.",
        cell_table(cells),
        "## Plots",
        " ".join(f"![{name}]({out.name}/{name})" for name in images),
    ]
    return "\n\n".join(parts)
