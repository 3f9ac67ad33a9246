"""Figures from records: one summary per (target, workload) cell."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from hiveroute.bench import router_lag
from hiveroute.bench.records import LoadSample, RequestRecord, UnitRecord


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _stats(values: Sequence[float], prefix: str) -> dict[str, float | None]:
    return {
        f"{prefix}_mean": (sum(values) / len(values)) if values else None,
        f"{prefix}_p50": percentile(values, 50),
        f"{prefix}_p90": percentile(values, 90),
        f"{prefix}_p99": percentile(values, 99),
    }


def summarize_cell(
    records: Sequence[RequestRecord],
    units: Sequence[UnitRecord],
    wall_s: float,
    engine_counts: tuple[float, float] = (0.0, 0.0),
    engine_ttft: tuple[float, float] = (0.0, 0.0),
    router_cpu_s: float | None = None,
    loop_lag: Mapping[float, float] | None = None,
) -> dict[str, Any]:
    """`engine_counts`: the engines' own (prefix-cache hits, queries); `engine_ttft`: their own
    (TTFT seconds summed, requests), so the time the router adds shows beside the clients'.
    `router_cpu_s`: the CPU the router's processes used meanwhile (None when not measured),
    per request sent: what a router costs on a real workload (streams relayed, KV events
    read), not only on a benchmark's instant answers. `loop_lag`: the router's event-loop lag
    histogram over the run (bench/router_lag.py), None for a router that exports none."""
    measured = [r for r in records if not r.cut]
    ok = [r for r in measured if r.ok]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached_known = [r for r in ok if r.cached_tokens is not None]
    cached = sum(r.cached_tokens or 0 for r in cached_known)
    prompt_with_cached = sum(r.prompt_tokens or 0 for r in cached_known)
    completion = sum(r.completion_tokens or 0 for r in ok)
    itl = [gap for r in ok for gap in r.itl_s]
    handoff_net = [r.handoff_s - r.planned_gap_s for r in ok if r.handoff_s is not None]
    done_units = [u for u in units if not u.cut and u.error is None and u.end_s is not None]
    summary: dict[str, Any] = {
        "requests": len(records),
        "ok": len(ok),
        "errors": len(measured) - len(ok),
        "cut": len(records) - len(measured),
        "error_examples": sorted({r.error or "" for r in measured if not r.ok})[:5],
        "units": len(units),
        "units_completed": len(done_units),
        "units_failed": sum(1 for u in units if u.error is not None),
        "wall_s": wall_s,
        "prompt_tokens": prompt,
        "cached_tokens": cached if cached_known else None,
        "completion_tokens": completion,
        "hit_rate": (cached / prompt_with_cached) if prompt_with_cached else None,
        # the engines' own counters (vllm:prefix_cache_hits / queries), when they export them
        "engine_hit_rate": engine_counts[0] / engine_counts[1] if engine_counts[1] > 0 else None,
        # the engines' own mean TTFT: the clients' mean minus this is what the router added
        "engine_ttft_s_mean": engine_ttft[0] / engine_ttft[1] if engine_ttft[1] > 0 else None,
        "output_tokens_per_s": completion / wall_s if wall_s > 0 else None,
        **_stats([r.ttft_s for r in ok if r.ttft_s is not None], "ttft_s"),
        **_stats([r.tpot_s for r in ok if r.tpot_s is not None], "tpot_s"),
        **_stats(itl, "itl_s"),
        **_stats([r.e2e_s for r in ok if r.e2e_s is not None], "e2e_s"),
        **_stats([u.duration_s for u in done_units if u.duration_s is not None], "unit_s"),
        **_stats(handoff_net, "handoff_s"),
        "requests_per_engine": requests_per_engine(ok),
        "router_cpu_s": router_cpu_s,
        "router_cpu_ms_per_request": router_cpu_s * 1000 / len(records)
        if router_cpu_s is not None and records
        else None,
        **_lag_quantiles(loop_lag),
    }
    return summary


def _lag_quantiles(loop_lag: Mapping[float, float] | None) -> dict[str, float | None]:
    """The router's event-loop lag p50/p99 in ms (None where it was not measured)."""
    out: dict[str, float | None] = {}
    for q in (0.5, 0.99):
        value = router_lag.quantile(q, loop_lag) if loop_lag else None
        out[f"router_loop_lag_ms_p{round(q * 100)}"] = None if value is None else value * 1000
    return out


def requests_per_engine(records: Iterable[RequestRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        if r.engine:
            counts[r.engine] = counts.get(r.engine, 0) + 1
    return dict(sorted(counts.items()))


def _growth_by_engine(
    loads: Sequence[LoadSample], read: Callable[[LoadSample], tuple[float | None, ...]]
) -> dict[str, tuple[float, ...]]:
    """How much each engine's counters (`read` from a sample) grew from its first sample that
    has them all to its last: one stretch of a run, whatever the engines counted before it."""
    first: dict[str, tuple[float, ...]] = {}
    last: dict[str, tuple[float, ...]] = {}
    for s in loads:
        values = read(s)
        if None in values:
            continue
        counters = tuple(v for v in values if v is not None)  # all of them, as floats
        first.setdefault(s.engine, counters)
        last[s.engine] = counters
    return {e: tuple(b - a for a, b in zip(first[e], last[e], strict=True)) for e in sorted(last)}


def _fleet_totals(growth: dict[str, tuple[float, ...]], width: int) -> tuple[float, ...]:
    return tuple(sum(g[i] for g in growth.values()) for i in range(width))


def engine_cache_counts(loads: Sequence[LoadSample]) -> tuple[float, float]:
    """(hits, queries) of the engines' own prefix-cache counters over one stretch of samples."""
    growth = _growth_by_engine(loads, lambda s: (s.prefix_hits, s.prefix_queries))
    hits, queries = _fleet_totals(growth, 2)
    return hits, queries


def engine_ttft_counts(loads: Sequence[LoadSample]) -> tuple[float, float]:
    """(TTFT seconds summed, requests) of the engines' own TTFT histograms over one stretch."""
    growth = _growth_by_engine(loads, lambda s: (s.ttft_sum, s.ttft_count))
    total, count = _fleet_totals(growth, 2)
    return total, count


def engine_request_counts(loads: Sequence[LoadSample]) -> dict[str, float]:
    """Requests each engine finished over one stretch of samples, by its own counter: what a
    router sent where, for routers that do not say (peers send no X-Hiveroute-Engine)."""
    growth = _growth_by_engine(loads, lambda s: (s.requests_done,))
    return {e: done for e, (done,) in growth.items()}


TABLE_COLUMNS = (
    ("target", "target", "{}"),
    ("workload", "workload", "{}"),
    ("ok", "ok", "{}"),
    ("errors", "err", "{}"),
    ("ttft_s_p50", "TTFT p50 ms", "ms"),
    ("ttft_s_p90", "TTFT p90 ms", "ms"),
    ("ttft_s_p99", "TTFT p99 ms", "ms"),
    ("tpot_s_p50", "TPOT p50 ms", "ms"),
    ("e2e_s_p50", "e2e p50 s", "s"),
    ("unit_s_p50", "workflow p50 s", "s"),
    ("handoff_s_p50", "hand-off p50 ms", "ms"),
    ("hit_rate", "hit rate", "pct"),
    ("output_tokens_per_s", "out tok/s", "int"),
    ("router_cpu_ms_per_request", "router CPU ms/req", "1f"),
    ("router_loop_lag_ms_p99", "router loop lag p99 ms", "1f"),
)


def _fmt(value: Any, how: str) -> str:
    if value is None:
        return "–"
    if how == "ms":
        return f"{value * 1000:.0f}"
    if how == "s":
        return f"{value:.2f}"
    if how == "pct":
        return f"{value * 100:.1f}%"
    if how == "int":
        return f"{value:.0f}"
    if how == "1f":
        return f"{value:.1f}"
    return str(value)


def markdown_table(cells: Sequence[dict[str, Any]]) -> str:
    head = "| " + " | ".join(title for _, title, _ in TABLE_COLUMNS) + " |"
    rule = "|" + "|".join("---" if how == "{}" else "---:" for _, _, how in TABLE_COLUMNS) + "|"
    rows = [
        "| " + " | ".join(_fmt(cell.get(key), how) for key, _, how in TABLE_COLUMNS) + " |"
        for cell in cells
    ]
    return "\n".join([head, rule, *rows])
