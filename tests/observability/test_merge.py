"""Merging several workers' metrics and dashboard overviews into one router's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hiveroute.observability.merge import merge_metrics, merge_overviews


def worker_text(requests: float, in_flight: float, up: float, kv_events: float) -> str:
    r = CollectorRegistry()
    Counter("hiveroute_requests", "requests", ["engine"], registry=r).labels("e1").inc(requests)
    Gauge("hiveroute_in_flight_requests", "in flight", ["engine"], registry=r).labels("e1").set(
        in_flight
    )
    Gauge("hiveroute_engine_up", "up", ["engine"], registry=r).labels("e1").set(up)
    Counter("hiveroute_kv_events", "events", ["engine"], registry=r).labels("e1").inc(kv_events)
    Gauge("hiveroute_workflows_active", "in the shared store", registry=r).set(5)
    return generate_latest(r).decode()


def value(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} missing")


def test_work_is_summed_and_shared_views_are_not_counted_twice() -> None:
    merged = merge_metrics([worker_text(3, 1, 1, 10), worker_text(4, 2, 0, 10)])
    assert value(merged, "hiveroute_requests_total") == 7
    assert value(merged, "hiveroute_in_flight_requests") == 3
    assert value(merged, "hiveroute_engine_up") == 1  # one engine, seen up by a worker
    assert value(merged, "hiveroute_kv_events_total") == 10  # every worker applies the same events
    assert value(merged, "hiveroute_workflows_active") == 5  # each counts the store they share


def test_overviews_sum_counts_and_recompute_rates() -> None:
    def one(requests: int, prompt: int, cached: int) -> dict[str, object]:
        engine = {"name": "e1", "requests": requests, "prompt_tokens": prompt,
                  "cached_tokens": cached, "in_flight": 1, "hit_rate": 0.0}  # fmt: skip
        totals = {"requests": requests, "prompt_tokens": prompt, "cached_tokens": cached,
                  "in_flight": 1}  # fmt: skip
        return {"object": "dashboard.overview", "engines": [engine], "totals": totals}

    merged = merge_overviews([one(2, 100, 50), one(3, 100, 0)])
    assert merged["engines"][0]["requests"] == 5 and merged["engines"][0]["hit_rate"] == 0.25
    assert merged["totals"]["in_flight"] == 2 and merged["totals"]["hit_rate"] == 0.25
    assert merged["workers"] == 2


def test_merged_counters_have_the_type_lines_one_process_writes() -> None:
    """Written under their family's name (`# TYPE hiveroute_requests counter` above samples
    named `hiveroute_requests_total`), a strict parser takes the samples for untyped ones."""
    one = worker_text(3, 1, 1, 10)
    merged = merge_metrics([one, worker_text(4, 2, 0, 10)])

    def type_lines(text: str) -> list[str]:
        return sorted(line for line in text.splitlines() if line.startswith("# TYPE"))

    assert type_lines(merged) == type_lines(one)
    assert "# TYPE hiveroute_requests_total counter" in merged
