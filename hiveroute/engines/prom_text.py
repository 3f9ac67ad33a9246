"""A small parser for the Prometheus text exposition format, for reading engines' /metrics."""

from __future__ import annotations

import math


def parse_prometheus_text(text: str) -> dict[str, float]:
    """Sum each metric family's samples over their labels: ``{"vllm:num_requests_running": 3.0}``.

    Engines label their series by model name (and data-parallel rank); the router wants one
    number per engine, so samples of one name are added up, except a share of a whole (vLLM's
    `*_perc`, a cache's usage), which is averaged: two half-full ranks are not a full cache.
    Comments and unparsable lines are skipped.
    """
    totals: dict[str, float] = {}
    shares: dict[str, int] = {}  # `*_perc` name -> its samples
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
        if name.endswith("_perc"):
            shares[name] = shares.get(name, 0) + 1
    for name, samples in shares.items():
        totals[name] /= samples
    return totals


def info_labels(text: str, name: str) -> dict[str, str] | None:
    """The labels of the first sample of info metric `name` (``vllm:cache_config_info``), or
    None when the text has none."""
    prefix = name + "{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        end = line.rfind("}")
        labels: dict[str, str] = {}
        for part in _split_labels(line[len(prefix) : end]):
            key, _, value = part.partition("=")
            labels[key.strip()] = value.strip().strip('"')
        return labels
    return None


def _split_labels(body: str) -> list[str]:
    """`a="1",b="x,y"` -> ['a="1"', 'b="x,y"']: commas inside quotes belong to the value."""
    parts: list[str] = []
    start, quoted, escaped = 0, False, False
    for i, ch in enumerate(body):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            parts.append(body[start:i])
            start = i + 1
    if body[start:].strip():
        parts.append(body[start:])
    return parts
