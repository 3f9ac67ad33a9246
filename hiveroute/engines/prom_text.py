"""A small parser for the Prometheus text exposition format, for reading engines' /metrics."""

from __future__ import annotations

import math


def parse_prometheus_text(text: str) -> dict[str, float]:
    """Sum each metric family's samples over their labels: ``{"vllm:num_requests_running": 3.0}``.

    Engines label their series by model name; the router wants one number per engine, so
    samples of one name are added up. Comments and unparsable lines are skipped.
    """
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace != -1:
            name = line[:brace]
            rest = line[line.rfind("}") + 1 :].split()
        else:
            name, _, tail = line.partition(" ")
            rest = tail.split()
        if not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        totals[name] = totals.get(name, 0.0) + value
    return totals
