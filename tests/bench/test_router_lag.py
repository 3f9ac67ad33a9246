"""The router's event-loop lag over a bench run, read from its own histogram."""

from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest

from hiveroute.bench import router_lag
from hiveroute.bench.summary import markdown_table, summarize_cell
from hiveroute.observability.metrics import RouterMetrics


def metrics_text(lags_s: list[float]) -> str:
    metrics = RouterMetrics()
    for lag in lags_s:
        metrics.loop_lag.observe(lag)
    return generate_latest(metrics.registry).decode()


def test_the_runs_samples_are_the_growth_between_two_reads() -> None:
    before = router_lag.parse_buckets(metrics_text([0.0002] * 50))
    after = router_lag.parse_buckets(metrics_text([0.0002] * 50 + [0.003] * 98 + [0.2, 0.2]))
    assert before is not None and after is not None
    run = router_lag.growth(before, after)
    assert run[math.inf] == 100 and run[0.0005] == 0  # the 50 before are not the run's
    # 98 of 100 samples in (2.5, 5] ms: the median is interpolated inside that bucket, the
    # 99th percentile lies in (0.1, 0.25] s, where the two long ones are
    assert router_lag.quantile(0.5, run) == 0.0025 + 0.0025 * 50 / 98
    p99 = router_lag.quantile(0.99, run)
    assert p99 is not None and 0.1 < p99 <= 0.25


def test_a_quantile_past_the_last_bound_is_that_bound_and_none_without_samples() -> None:
    assert router_lag.quantile(0.99, {0.1: 0.0, 1.0: 1.0, math.inf: 10.0}) == 1.0
    assert router_lag.quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None
    assert router_lag.parse_buckets("vllm:num_requests_running 3\n") is None  # not hiveroute


def test_the_summary_and_its_table_show_the_lag_when_measured() -> None:
    run = router_lag.parse_buckets(metrics_text([0.003] * 100))
    summary = summarize_cell([], [], 1.0, loop_lag=run)
    # rank 99 of 100, all in (2.5, 5] ms: 2.5 + 2.5 * 99 / 100
    assert summary["router_loop_lag_ms_p99"] == pytest.approx(4.975)
    assert summarize_cell([], [], 1.0)["router_loop_lag_ms_p99"] is None  # a peer
    table = markdown_table([{"target": "t", "workload": "w", **summary}])
    header, _, row = table.splitlines()[:3]
    assert header.rstrip(" |").endswith("router loop lag p99 ms") and row.endswith("| 5.0 |")
