"""The local recipe and the container image's recipe hold together."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hiveroute.config import RouterConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "deploy" / "local" / "run.sh"


def test_local_config_loads_as_serve_loads_it() -> None:
    config: RouterConfig = load_config(
        {"config": str(ROOT / "deploy" / "local" / "hiveroute.yaml")}, env={}
    )
    assert [s.url for s in config.engine_specs] == [
        "http://127.0.0.1:8100",
        "http://127.0.0.1:8101",
    ]
    assert [s.events for s in config.engine_specs] == [
        "tcp://127.0.0.1:5557",
        "tcp://127.0.0.1:5558",
    ]
    assert (config.port, config.discovery, config.state) == (8080, "static", "memory")
    assert config.policy == RouterConfig().policy == "workflow"  # the default, using the events


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(RUN), *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_run_script_parses_and_explains_itself() -> None:
    assert subprocess.run(["bash", "-n", str(RUN)], check=False).returncode == 0
    done = run("--help")
    assert done.returncode == 0
    assert "--vllm" in done.stdout and "set -euo" not in done.stdout


def test_run_script_refuses_bad_options() -> None:
    for args, message in [
        (("--engines", "zero"), "--engines must be a positive number"),
        (("--port",), "--port needs a number"),
        (("--frobnicate",), "unknown option --frobnicate"),
    ]:
        done = run(*args)
        assert done.returncode == 2, args
        assert message in done.stderr


def test_dockerfile_copies_what_exists_and_runs_unprivileged() -> None:
    lines = [line.split() for line in (ROOT / "Dockerfile").read_text().splitlines() if line]
    copied = [
        w for line in lines if line[0] == "COPY" and "--from=build" not in line for w in line[1:-1]
    ]
    assert copied and all((ROOT / path).exists() for path in copied)
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert all(f"!{path}" in ignored or f"!{path}/" in ignored for path in copied)
    user = [line for line in lines if line[0] == "USER"]
    assert user and not user[-1][1].startswith(("0", "root"))
    assert ["EXPOSE", "8080"] in lines
    entry = next(line for line in lines if line[0] == "ENTRYPOINT")
    assert json.loads(" ".join(entry[1:])) == ["hiveroute", "serve"]
    assert {tuple(line[:2]) for line in lines if line[0] == "FROM"} == {
        ("FROM", "python:3.11-slim")
    }
