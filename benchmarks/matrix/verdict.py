"""Who won each cell, and whether the default policy meets issue 22's targets. Pure functions
of the per-cell results (no timing), so that they are tested on their own.

Per router and metric, a cell's figure is the median of its seeds and its spread the range
(max - min) of its seeds. Won / tied / lost, per cell and metric:

- the best router has the best median (highest hit rate, lowest TTFT);
- the top group is the best router and every router whose median is within the larger of the
  two routers' spreads of the best median;
- a top group of one router: it *won*; of several: each of them *tied*; the rest *lost*.

With one seed the spread is 0, so only equal figures tie.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

DEFAULT = "hiveroute:workflow"
PEERS = ("smg", "sglang", "vllm-router")
IDEAL = "ideal"
# metric -> higher is better
METRICS: dict[str, bool] = {
    "hit_rate": True,
    "ttft_mean": False,
    "ttft_p99": False,
    "tpot_mean": False,
    "downstream_ttft_mean": False,
    "workflow_s_mean": False,
    "router_cpu_ms": False,  # the router's processes' CPU per request, in ms
}


@dataclass(frozen=True)
class Figure:
    median: float
    spread: float
    seeds: int


def figure(values: Iterable[float | None]) -> Figure | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return Figure(median(known), max(known) - min(known), len(known))


def figures(cell: Mapping[str, Any], metric: str) -> dict[str, Figure]:
    """router -> its figure for `metric` over the cell's successful runs."""
    by_router: dict[str, list[float | None]] = {}
    for run in cell.get("runs", {}).values():
        if run.get("status") == "ok":
            by_router.setdefault(run["router"], []).append(run.get(metric))
    out = {}
    for router, values in by_router.items():
        fig = figure(values)
        if fig is not None:
            out[router] = fig
    return out


def classify(figs: Mapping[str, Figure], higher_better: bool) -> dict[str, str]:
    """router -> won | tied | lost, as defined above."""
    if not figs:
        return {}
    sign = 1.0 if higher_better else -1.0
    best = max(figs, key=lambda r: (sign * figs[r].median, r))
    top = {
        r
        for r, f in figs.items()
        if abs(f.median - figs[best].median) <= max(f.spread, figs[best].spread)
    }
    if len(top) == 1:
        return {r: "won" if r == best else "lost" for r in figs}
    return {r: "tied" if r in top else "lost" for r in figs}


def tally(cells: Sequence[Mapping[str, Any]], metric: str) -> dict[str, dict[str, int]]:
    """router -> {won, tied, lost} counts over the cells that have `metric` (the ideal is a
    reference, not a contestant)."""
    counts: dict[str, dict[str, int]] = {}
    for cell in cells:
        figs = {r: f for r, f in figures(cell, metric).items() if r != IDEAL}
        for router, verdict in classify(figs, METRICS[metric]).items():
            counts.setdefault(router, {"won": 0, "tied": 0, "lost": 0})[verdict] += 1
    return counts


def best_peer(figs: Mapping[str, Figure], higher_better: bool) -> tuple[str, Figure] | None:
    peers = {r: f for r, f in figs.items() if r in PEERS}
    if not peers:
        return None
    sign = 1.0 if higher_better else -1.0
    name = max(peers, key=lambda r: (sign * peers[r].median, r))
    return name, peers[name]


@dataclass
class Check:
    """One target: met or not, and the cells that miss it (with the figures that say so)."""

    target: str
    met: bool | None  # None: no cell could be judged
    judged: int
    misses: list[str]
    detail: str = ""


def check_hit_rate(cells: Sequence[Mapping[str, Any]], default: str = DEFAULT) -> Check:
    misses, judged = [], 0
    for cell in cells:
        figs = figures(cell, "hit_rate")
        peer = best_peer(figs, True)
        if default not in figs or peer is None:
            continue
        judged += 1
        mine, (name, theirs) = figs[default], peer
        if mine.median < theirs.median - max(mine.spread, theirs.spread):
            misses.append(f"{cell['cell']} ({mine.median:.3f} vs {name} {theirs.median:.3f})")
    return _check(
        "hit rate never behind the best peer by more than the seed spread", judged, misses
    )


def check_ttft(cells: Sequence[Mapping[str, Any]], metric: str, default: str = DEFAULT) -> Check:
    misses, judged = [], 0
    for cell in cells:
        figs = figures(cell, metric)
        peer = best_peer(figs, False)
        if default not in figs or peer is None:
            continue
        judged += 1
        mine, (name, theirs) = figs[default], peer
        if mine.median > 1.05 * theirs.median:
            misses.append(
                f"{cell['cell']} ({1000 * mine.median:.0f} vs {name} {1000 * theirs.median:.0f} ms)"
            )
    return _check(f"{metric} at most 1.05 x the best peer's", judged, misses)


def check_downstream(cells: Sequence[Mapping[str, Any]], default: str = DEFAULT) -> Check:
    ratios: list[float] = []
    names = []
    for cell in cells:
        figs = figures(cell, "downstream_ttft_mean")
        peer = best_peer(figs, False)
        if default not in figs or peer is None or not figs[default].median:
            continue
        ratios.append(peer[1].median / figs[default].median)
        names.append(f"{cell['cell']} {ratios[-1]:.2f}")
    if not ratios:
        return Check(
            "agentic: median (best peer / default) downstream-agent TTFT >= 1.3", None, 0, []
        )
    m = median(ratios)
    low = [n for n, r in zip(names, ratios, strict=True) if r < 1.3]
    return Check(
        "agentic: median (best peer / default) downstream-agent TTFT >= 1.3",
        m >= 1.3,
        len(ratios),
        low,
        f"median ratio {m:.2f} over {len(ratios)} cells",
    )


def check_workflow_time(cells: Sequence[Mapping[str, Any]], default: str = DEFAULT) -> Check:
    wins, misses, judged = 0, [], 0
    for cell in cells:
        figs = figures(cell, "workflow_s_mean")
        peer = best_peer(figs, False)
        if default not in figs or peer is None:
            continue
        judged += 1
        if figs[default].median < peer[1].median:
            wins += 1
        else:
            misses.append(
                f"{cell['cell']} ({figs[default].median:.2f} vs {peer[0]} {peer[1].median:.2f} s)"
            )
    met = None if not judged else wins * 2 > judged
    return Check(
        "agentic: workflow completion time below the best peer's in most cells",
        met,
        judged,
        misses,
        f"{wins} of {judged}",
    )


def starved(run: Mapping[str, Any], engines: int) -> bool:
    """An engine got less than half its fair share of the run's requests."""
    counts = list(run.get("engine_requests") or [])
    total = sum(counts)
    if total <= 0:
        return False
    counts += [0] * (engines - len(counts))
    return min(counts) < 0.5 * total / engines


def check_fair_share(
    cells: Sequence[Mapping[str, Any]], engines: int, default: str = DEFAULT
) -> Check:
    misses, judged = [], 0
    for cell in cells:
        runs = [
            r for r in cell["runs"].values() if r["router"] == default and r.get("status") == "ok"
        ]
        if not runs:
            continue
        judged += 1
        bad = [r for r in runs if starved(r, engines)]
        if bad:
            misses.append(f"{cell['cell']} ({'; '.join(str(r['engine_requests']) for r in bad)})")
    return _check("no engine below half its fair share", judged, misses)


def check_ideal(cells: Sequence[Mapping[str, Any]], default: str = DEFAULT) -> Check:
    misses, judged = [], 0
    for cell in cells:
        if not cell.get("fits"):
            continue
        figs = figures(cell, "hit_rate")
        if default not in figs or IDEAL not in figs or not figs[IDEAL].median:
            continue
        judged += 1
        share = figs[default].median / figs[IDEAL].median
        if share < 0.95:
            misses.append(f"{cell['cell']} ({share:.0%} of {figs[IDEAL].median:.3f})")
    return _check(
        "hit rate >= 95 % of the one-cache ideal where the working set fits", judged, misses
    )


def _labelled(check: Check, suffix: str) -> Check:
    return Check(check.target + suffix, check.met, check.judged, check.misses, check.detail)


def _check(target: str, judged: int, misses: list[str]) -> Check:
    return Check(target, None if not judged else not misses, judged, misses)


REFS = "+refs"


def with_refs(cells: Sequence[Mapping[str, Any]], default: str = DEFAULT) -> list[dict[str, Any]]:
    """The cells with the default's runs replaced by its `+refs` runs where a cell has them (the
    role-first agentic cells): the default as a user of the context API would run it."""
    out = []
    for cell in cells:
        runs = cell.get("runs", {})
        refs = {k: v for k, v in runs.items() if v["router"] == default + REFS}
        if not refs:
            out.append(dict(cell))
            continue
        kept = {k: v for k, v in runs.items() if v["router"] not in (default, default + REFS)}
        kept.update({k: {**v, "router": default} for k, v in refs.items()})
        out.append({**cell, "runs": kept})
    return out


def targets(
    cells: Sequence[Mapping[str, Any]], engines: int, default: str = DEFAULT
) -> list[Check]:
    agentic = [c for c in cells if c.get("workload") == "agentic"]
    return [
        check_hit_rate(cells, default),
        check_ttft(cells, "ttft_mean", default),
        check_ttft(cells, "ttft_p99", default),
        check_downstream(agentic, default),
        check_workflow_time(agentic, default),
        *(
            _labelled(c, " (+refs in role-first cells)")
            for c in (
                check_downstream(with_refs(agentic, default), default),
                check_workflow_time(with_refs(agentic, default), default),
            )
        ),
        check_fair_share(cells, engines, default),
        check_ideal(cells, default),
    ]
