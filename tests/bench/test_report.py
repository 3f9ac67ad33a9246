"""A whole run on fake engines: every report file written, the command and machine recorded."""

from __future__ import annotations

import json
from pathlib import Path

from hiveroute.bench.command import options_from_args
from hiveroute.bench.engines import EngineOptions, Fleet
from hiveroute.bench.harness import run_benchmark
from hiveroute.cli import build_parser
from tests.bench.helpers import timed_engine
from tests.support.fake_engine import FakeEngine


async def test_a_run_writes_records_summary_table_and_plots(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": i * 10,
                    "input_length": 300,
                    "output_length": 4,
                    "hash_ids": [0, i + 1],
                }
            )
            + "\n"
            for i in range(4)
        )
    )
    engines: list[FakeEngine] = []

    async def fake_fleet(options: EngineOptions, log: Path) -> Fleet:
        started = [
            await timed_engine(ttft_s=0.01, itl_s=0.001).start() for _ in range(options.count)
        ]
        engines.extend(started)
        urls = [e.url for e in started]
        return Fleet(specs=urls, urls=urls, kind="fake")

    argv = [
        "bench",
        "compare",
        "--target",
        "engine",
        "--target",
        "hiveroute-inproc:round_robin",
        "--workload",
        "agentic",
        "--workload",
        "trace",
        "--trace",
        str(trace),
        "--workflows",
        "2",
        "--fan-out",
        "2",
        "--rounds",
        "1",
        "--kb-tokens",
        "100",
        "--tool-gap",
        "const:0.01",
        "--workflow-rate",
        "0",
        "--slices",
        "2",
        "--out",
        str(tmp_path / "runs"),
        "--quiet",
    ]
    options = options_from_args(build_parser().parse_args(argv), ["hiveroute", *argv])
    options.fleet_factory = fake_fleet
    try:
        result = await run_benchmark(options)
    finally:
        for engine in engines:
            await engine.stop()

    run_dir = result.run_dir
    assert run_dir.parent == tmp_path / "runs"
    for name in (
        "requests.jsonl",
        "units.jsonl",
        "load.jsonl",
        "summary.json",
        "report.md",
        "ttft_cdf.png",
        "hit_rate.png",
        "engine_load.png",
    ):
        assert (run_dir / name).stat().st_size > 0, name
    records = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 2 * (2 * 6 + 4)  # 2 targets x (2 workflows x 6 requests + 4 trace)
    assert all(r["error"] is None and r["ttft_s"] > 0 for r in records)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["command"] == ["hiveroute", *argv]
    assert summary["environment"]["cpu_count"] >= 1
    cells = {(c["target"], c["workload"]): c for c in summary["cells"]}
    assert set(cells) == {
        (t, w) for t in ("engine", "hiveroute-inproc:round_robin") for w in ("agentic", "trace")
    }
    assert cells[("engine", "agentic")]["units_completed"] == 2
    assert cells[("engine", "trace")]["ok"] == 4
    # no router process of its own: nothing to read its CPU from
    assert cells[("hiveroute-inproc:round_robin", "trace")]["router_cpu_ms_per_request"] is None
    assert 0 < cells[("engine", "agentic")]["hit_rate"] < 1
    report = (run_dir / "report.md").read_text()
    assert "| hiveroute-inproc:round_robin | agentic |" in report
    assert " ".join(["hiveroute", *argv]) in report
    assert (run_dir / "ttft_cdf.png").read_bytes()[:4] == b"\x89PNG"
