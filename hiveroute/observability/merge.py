"""Several router workers' metrics and dashboard overviews, merged into one router's.

Under `serve --workers N` every worker counts the requests it served; the router's figures are
the sums. What each worker observes of the same engines (health, queue depth, KV use) or builds
from the same event streams (each worker's own KV index) is one fact seen N times: the merge
takes the largest, not the sum, so a fleet of 2 engines never reads as 4.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

# Gauges that are each worker's share of one total. (`hiveroute_workflows_active` is not: each
# worker counts the store's, which the workers share.)
SUMMED_GAUGES = frozenset({"hiveroute_in_flight_requests"})
# Families every worker builds from the same engines' events: one view, seen N times.
SHARED_VIEW_PREFIX = "hiveroute_kv_"


def _summed(family_name: str, family_type: str) -> bool:
    if family_name.startswith(SHARED_VIEW_PREFIX):
        return False
    if family_type == "gauge":
        return family_name in SUMMED_GAUGES
    return family_type in ("counter", "histogram", "summary", "untyped", "unknown")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def merge_metrics(texts: list[str]) -> str:
    """Prometheus text from each worker, as one router's (same families, merged samples)."""
    families: dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            _, kind, samples = families.setdefault(
                family.name, (family.documentation, family.type, {})
            )
            summed = _summed(family.name, family.type)
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                old = samples.get(key)
                if old is None:
                    samples[key] = sample.value
                elif sample.name.endswith("_created"):
                    samples[key] = min(old, sample.value)
                elif summed:
                    samples[key] = old + sample.value
                else:
                    samples[key] = max(old, sample.value)
    lines: list[str] = []
    for name, (doc, kind, samples) in families.items():
        if kind == "counter":  # as one process writes it: `x_total` a counter, `x_created` a gauge
            total = {k: v for k, v in samples.items() if not k[0].endswith("_created")}
            created = {k: v for k, v in samples.items() if k[0].endswith("_created")}
            _family(lines, f"{name}_total", doc, "counter", total)
            if created:
                _family(lines, f"{name}_created", doc, "gauge", created)
        else:
            _family(lines, name, doc, kind, samples)
    return "\n".join(lines) + "\n"


def _family(
    lines: list[str],
    name: str,
    doc: str,
    kind: str,
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float],
) -> None:
    lines.append(
        f"# HELP {name} {doc.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}"
    )
    lines.append(f"# TYPE {name} {kind}")
    for (sample_name, labels), value in samples.items():
        if labels:
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{sample_name}{{{inner}}} {floatToGoString(value)}")
        else:
            lines.append(f"{sample_name} {floatToGoString(value)}")


_ENGINE_SUMS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "cross_agent_cached_tokens",
    "in_flight",
)
_TOTAL_SUMS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "cross_agent_cached_tokens",
    "in_flight",
)


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 6) if whole > 0 else None


def merge_overviews(overviews: list[dict[str, Any]]) -> dict[str, Any]:
    """The dashboard overviews of each worker, as one router's: per-engine and fleet counts
    summed, rates recomputed from the sums, health and load from the first worker."""
    if not overviews:
        return {"object": "dashboard.overview", "engines": [], "totals": {}}
    merged = dict(overviews[0])
    engines: dict[str, dict[str, Any]] = {e["name"]: dict(e) for e in merged.get("engines", [])}
    totals = dict(merged.get("totals", {}))
    for other in overviews[1:]:
        for engine in other.get("engines", []):
            mine = engines.get(engine["name"])
            if mine is None:
                engines[engine["name"]] = dict(engine)
                continue
            for key in _ENGINE_SUMS:
                if isinstance(engine.get(key), (int, float)):
                    mine[key] = (mine.get(key) or 0) + engine[key]
        for key in _TOTAL_SUMS:
            if isinstance(other.get("totals", {}).get(key), (int, float)):
                totals[key] = (totals.get(key) or 0) + other["totals"][key]
    for engine in engines.values():
        engine["hit_rate"] = _ratio(engine.get("cached_tokens", 0), engine.get("prompt_tokens", 0))
    totals["hit_rate"] = _ratio(totals.get("cached_tokens", 0), totals.get("prompt_tokens", 0))
    totals["cross_agent_hit_rate"] = _ratio(
        totals.get("cross_agent_cached_tokens", 0), totals.get("prompt_tokens", 0)
    )
    merged["engines"] = list(engines.values())
    merged["totals"] = totals
    merged["workers"] = len(overviews)
    return merged
