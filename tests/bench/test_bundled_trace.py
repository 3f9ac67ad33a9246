"""The trace workload runs out of the box: a slice of the Mooncake trace ships as package data."""

import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from hiveroute.bench.workloads.trace import BUNDLED_TRACE, default_trace_path, read_trace
from hiveroute.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_trace_is_the_bundled_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HIVEROUTE_TRACE", raising=False)
    assert default_trace_path() == BUNDLED_TRACE
    assert BUNDLED_TRACE.is_relative_to(ROOT / "hiveroute")
    rows = read_trace(BUNDLED_TRACE, 0)
    assert len(rows) == 1000
    with pytest.raises(ConfigError, match="--trace FILE"):
        read_trace(BUNDLED_TRACE, 10, skip=1000)
    monkeypatch.setenv("HIVEROUTE_TRACE", "/elsewhere.jsonl")
    assert default_trace_path() == Path("/elsewhere.jsonl")


def test_the_slice_and_its_license_are_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["hiveroute"]
    data = BUNDLED_TRACE.parent
    for name in (BUNDLED_TRACE.name, "LICENSE-Mooncake.txt", "README.md"):
        assert (data / name).exists()
        relative = str((data / name).relative_to(ROOT / "hiveroute"))
        assert any(
            fnmatch(relative, p) or fnmatch(relative, p.replace("**/", "")) for p in patterns
        ), name
    assert "Apache License" in (data / "LICENSE-Mooncake.txt").read_text()
    assert "kvcache-ai/Mooncake" in (data / "README.md").read_text()
