"""Reading what the router logged and counted for a request, in tests."""

from __future__ import annotations

from typing import Any

import pytest


def access_lines(caplog: pytest.LogCaptureFixture, request_id: str) -> list[dict[str, Any]]:
    """The access-log lines (their fields) written for `request_id`."""
    found = []
    for record in caplog.records:
        fields = getattr(record, "fields", None)
        if record.name == "hiveroute.access" and fields and fields["request_id"] == request_id:
            found.append(fields)
    return found


def metric_sum(text: str, name: str) -> float:
    """The sum of every labelled sample of `name` in a /metrics page."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")
    )
