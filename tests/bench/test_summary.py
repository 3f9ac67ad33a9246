"""Figures read off the engines' own counters."""

from __future__ import annotations

from hiveroute.bench.records import LoadSample
from hiveroute.bench.summary import engine_request_counts


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
