"""Reading an engine's /metrics: one number per engine from series labelled per model and rank."""

from __future__ import annotations

import pytest

from hiveroute.engines.prom_text import parse_prometheus_text

TWO_RANKS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:num_requests_waiting{engine="0",model_name="m"} NaN
"""


def test_counts_add_up_over_ranks_and_a_share_of_a_whole_is_their_mean() -> None:
    """A data-parallel engine reports one series per rank: its requests are the sum, its
    cache usage the mean (added, two half-full caches read as one full one)."""
    values = parse_prometheus_text(TWO_RANKS)
    assert values["vllm:num_requests_running"] == 5.0
    assert values["vllm:kv_cache_usage_perc"] == pytest.approx(0.375)
    assert "vllm:num_requests_waiting" not in values  # NaN: no number
