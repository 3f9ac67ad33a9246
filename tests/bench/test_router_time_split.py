"""The router-time split (benchmarks/router_time_split.py) on a run small enough to check by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.router_time_split import split, table


def write_run(root: Path, client: list[dict[str, object]], access: list[dict[str, object]]) -> Path:
    run = root / "run"
    (run / "logs").mkdir(parents=True)
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in client))
    lines = [json.dumps({"logger": "hiveroute.access", **a}) for a in access]
    # what else a router log holds: a decision line, a line that is not JSON
    lines.insert(1, json.dumps({"logger": "hiveroute.routing", "msg": "decision", "ttft_ms": 1}))
    lines.append("Traceback (most recent call last): hiveroute.access")
    (run / "logs" / "target-hiveroute-workflow.log").write_text("\n".join(lines) + "\n")
    return run


def test_it_splits_each_request_the_client_and_the_router_both_timed(tmp_path: Path) -> None:
    run = write_run(
        tmp_path,
        [
            {"request_id": "a", "status": 200, "ttft_s": 0.020, "t_send_s": 0.000},
            {"request_id": "b", "status": 200, "ttft_s": 0.050, "t_send_s": 0.010},
            {"request_id": "c", "status": 503, "ttft_s": None, "t_send_s": 0.011},  # failed
            # the router never logged it; sent after b, so not in b's burst
            {"request_id": "d", "status": 200, "ttft_s": 0.030, "t_send_s": 0.015},
        ],
        [
            {"request_id": "a", "ttft_ms": 15.0, "overhead_ms": 1.0},
            {"request_id": "b", "ttft_ms": 30.0, "overhead_ms": 3.0},
            {"request_id": "c", "ttft_ms": None, "overhead_ms": None},
        ],
    )
    s = split(run)
    assert s.requests == 2
    assert s.outside == pytest.approx([5.0, 20.0])
    assert s.in_handler == [1.0, 3.0]
    assert s.client_ttft_mean == pytest.approx(35.0)
    assert s.router_ttft_mean == pytest.approx(22.5)
    assert s.sent_before == [0, 1]  # b was sent 10 ms after a
    text = table([s])
    # p90 as the bench summary interpolates it: 5 + 0.9 x 15, 1 + 0.9 x 2
    assert "| run | 2 | 35.0 | 22.5 | 12.5 / 12.5 / 18.5 | 2.00 / 2.00 / 2.80 |" in text
    assert "| run | 5.0 (1) | 20.0 (1) | – | – |" in text


def test_a_run_without_access_lines_says_how_to_get_them(tmp_path: Path) -> None:
    run = write_run(tmp_path, [{"request_id": "a", "status": 200, "ttft_s": 0.02}], [])
    with pytest.raises(SystemExit, match="--router-log-level info"):
        split(run)
