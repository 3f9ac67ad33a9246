"""The router's event-loop lag over a run, from its own histogram: the wait a request met
inside the router before the router read it (observability/loop_lag.py), which no client-side
figure separates from the engines' time.

The harness reads `hiveroute_event_loop_lag_seconds` from each replica's /metrics (its workers
merged) before and after each slice; the growth of the buckets is the run's, and its quantiles
are computed as Prometheus' `histogram_quantile` does. Peers export no such series: None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import aiohttp

SERIES = "hiveroute_event_loop_lag_seconds_bucket"
Buckets = dict[float, float]  # upper bound (seconds, inf last) -> samples at or below it


def parse_buckets(text: str) -> Buckets | None:
    """The lag histogram's cumulative buckets in a /metrics text; None if it has none."""
    buckets: Buckets = {}
    for line in text.splitlines():
        if not line.startswith(SERIES + "{"):
            continue
        labels, _, value = line.rpartition("}")
        bound = labels.partition('le="')[2].partition('"')[0]
        try:
            buckets[float(bound)] = buckets.get(float(bound), 0.0) + float(value.split()[0])
        except (ValueError, IndexError):
            return None
    return buckets or None


async def read_buckets(http: aiohttp.ClientSession, urls: Sequence[str]) -> Buckets | None:
    """Every replica's buckets summed; None when one cannot be read (or is not hiveroute)."""
    total: Buckets = {}
    for url in urls:
        try:
            async with http.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                text = await r.text() if r.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError):
            return None
        found = parse_buckets(text)
        if found is None:
            return None
        add(total, found)
    return total


def growth(before: Mapping[float, float], after: Mapping[float, float]) -> Buckets:
    """The samples taken between two reads, bucket by bucket."""
    return {bound: after[bound] - before.get(bound, 0.0) for bound in after}


def add(total: Buckets, more: Mapping[float, float]) -> None:
    for bound, count in more.items():
        total[bound] = total.get(bound, 0.0) + count


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The `q` quantile of cumulative `buckets`, interpolated within its bucket; a quantile in
    the +Inf bucket is the highest finite bound (what Prometheus answers). None: no samples."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower
