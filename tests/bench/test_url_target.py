"""`hiveroute bench --target http://HOST:PORT` drives a deployment that is already running."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hiveroute.bench.command import options_from_args
from hiveroute.bench.engines import EngineOptions, Fleet
from hiveroute.bench.harness import run_benchmark
from hiveroute.bench.targets import TargetSpec
from hiveroute.cli import build_parser, main
from hiveroute.config import RouterConfig
from hiveroute.errors import ConfigError
from hiveroute.gateway.server import start_router
from tests.bench.helpers import timed_engine


def test_url_targets_parse() -> None:
    spec = TargetSpec.parse("http://127.0.0.1:8080/")
    assert (spec.kind, spec.url, spec.label, spec.external) == (
        "url",
        "http://127.0.0.1:8080",
        "http://127.0.0.1:8080",
        True,
    )
    assert TargetSpec.parse("https://router.example").url == "https://router.example"
    for bad in ("http://", "http://host:80/v1", "http://host:port", "http://h:1?x=1"):
        with pytest.raises(ConfigError, match="http://HOST:PORT"):
            TargetSpec.parse(bad)


def test_an_unreachable_deployment_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.services import free_port

    argv = ["bench", "run", "--target", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path)]
    assert main([*argv, "--workflows", "1", "--quiet"]) != 0
    assert "/v1/models" in capsys.readouterr().err


async def test_a_run_against_a_running_router_starts_no_engines(tmp_path: Path) -> None:
    engine = await timed_engine(ttft_s=0.01, itl_s=0.001).start()
    router = await start_router(
        RouterConfig(host="127.0.0.1", port=0, engine=[engine.url], policy="round_robin").validate()
    )
    started: list[EngineOptions] = []

    async def no_fleet(options: EngineOptions, log: Path) -> Fleet:
        started.append(options)
        raise AssertionError("a URL target needs no engines")

    argv = ["bench", "run", "--target", router.url, "--workflows", "2", "--fan-out", "2"]
    argv += ["--rounds", "1", "--kb-tokens", "100", "--tool-gap", "const:0.01"]
    argv += ["--workflow-rate", "0", "--out", str(tmp_path), "--quiet"]
    options = options_from_args(build_parser().parse_args(argv), ["hiveroute", *argv])
    options.fleet_factory = no_fleet
    try:
        result = await run_benchmark(options)
    finally:
        await router.stop()
        await engine.stop()
    assert started == []
    records = [json.loads(x) for x in (result.run_dir / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 6 and all(r["error"] is None for r in records)
    assert {r["sent_to"] for r in records} == {router.url}
    assert len(engine.received) == 12  # every request went through the router to its engine
    (cell,) = json.loads((result.run_dir / "summary.json").read_text())["cells"]
    assert cell["target"] == router.url and cell["ok"] == 12
