"""Figures read off the engines' own counters."""

from __future__ import annotations

from hiveroute.bench.records import LoadSample, RequestRecord
from hiveroute.bench.summary import engine_request_counts, engine_ttft_counts, summarize_cell


def sample(t: float, engine: str, done: float | None) -> LoadSample:
    return LoadSample(t, engine, 0.0, 0.0, 0.0, None, None, requests_done=done)


def test_requests_per_engine_are_the_growth_of_each_engines_success_counter() -> None:
    loads = [
        sample(0, "engine0", 10),  # engines ran earlier slices: only the growth counts
        sample(0, "engine1", 0),
        sample(1, "engine0", 14),
        sample(1, "engine1", 3),
        sample(1, "engine2", None),  # an engine without the counter is left out
        sample(2, "engine0", 17),
        sample(2, "engine1", 3),
    ]
    assert engine_request_counts(loads) == {"engine0": 7, "engine1": 3}
    assert engine_request_counts([]) == {}


def ttft_sample(t: float, engine: str, total: float | None, count: float | None) -> LoadSample:
    return LoadSample(t, engine, 0.0, 0.0, 0.0, None, None, ttft_sum=total, ttft_count=count)


def test_the_engines_own_ttft_is_the_growth_of_their_histograms_over_the_stretch() -> None:
    loads = [
        ttft_sample(0, "engine0", 5.0, 100),  # earlier slices' requests do not count
        ttft_sample(0, "engine1", 0.0, 0),
        ttft_sample(1, "engine0", 5.3, 103),
        ttft_sample(1, "engine1", 0.1, 1),
        ttft_sample(1, "engine2", None, None),  # a peer's engine without the histogram
        ttft_sample(2, "engine0", 5.6, 106),
    ]
    total, count = engine_ttft_counts(loads)
    assert count == 7
    assert abs(total - 0.7) < 1e-9
    record = RequestRecord("r", "u", "t", "w", "chat", t_send_s=0.0, max_tokens=8)
    record.status, record.ttft_s = 200, 0.2
    summary = summarize_cell([record], [], 1.0, engine_ttft=(total, count))
    assert abs(summary["engine_ttft_s_mean"] - 0.1) < 1e-9
    assert summarize_cell([record], [], 1.0)["engine_ttft_s_mean"] is None


def test_the_routers_cpu_is_given_per_request_sent_when_it_was_measured() -> None:
    records = []
    for i in range(4):
        record = RequestRecord(f"r{i}", "u", "t", "w", "chat", t_send_s=0.0, max_tokens=8)
        record.status, record.ttft_s = (200, 0.1) if i else (500, None)  # a failure costs too
        records.append(record)
    summary = summarize_cell(records, [], 1.0, router_cpu_s=0.02)
    assert summary["router_cpu_s"] == 0.02
    assert abs(summary["router_cpu_ms_per_request"] - 5.0) < 1e-9
    unmeasured = summarize_cell(records, [], 1.0)  # an in-process router, a deployment
    assert unmeasured["router_cpu_ms_per_request"] is None
    assert summarize_cell([], [], 1.0, router_cpu_s=0.5)["router_cpu_ms_per_request"] is None
