"""The harness on the simulator: simulated engines in their own process, and the demo end to end
(small and on the `fast` preset, so it takes seconds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import aiohttp
import pytest

from hiveroute.bench.engines import EngineOptions, start_fleet
from hiveroute.cli import main


async def test_sim_fleet_runs_in_its_own_process_and_stops(tmp_path: Path) -> None:
    fleet = await start_fleet(EngineOptions(count=2, preset="fast"), tmp_path / "sim.log")
    try:
        assert len(fleet.urls) == 2 and all("events=tcp://" in s for s in fleet.specs)
        async with aiohttp.ClientSession() as http:
            for url in fleet.urls:
                async with http.get(url + "/v1/models") as response:
                    assert response.status == 200
    finally:
        await fleet.stop()
    assert fleet._child is not None and fleet._child.proc.returncode is not None


def test_demo_compares_round_robin_with_the_best_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "demo",
            "--out",
            str(tmp_path),
            "--workflows",
            "1",
            "--num-engines",
            "2",
            "--preset",
            "fast",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "| hiveroute:round_robin | agentic |" in out
    assert "report: " in out
    (run_dir,) = tmp_path.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["cells"]) == 2
    assert all(cell["ok"] == 16 and cell["errors"] == 0 for cell in summary["cells"])
    if sys.platform == "linux":  # each router subprocess's CPU, from /proc, per request
        assert all(cell["router_cpu_ms_per_request"] > 0 for cell in summary["cells"])
    assert summary["command"][:2] == ["hiveroute", "demo"]
