"""A lean install works: the core imports no optional package, and each optional feature names
the extra that brings it when it is missing."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hiveroute.errors import ConfigError
from hiveroute.extras import EXTRAS, MissingExtra, require

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = [
    "matplotlib",
    "kubernetes",
    "opentelemetry",
    "mcp",
    "anyio",
    "redis",
    "openai",
    "beeai_framework",
]

# Runs in a fresh interpreter in which the optional packages cannot be imported.
LEAN = """
import asyncio, importlib.abc, sys
BLOCKED = %r
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
sys.meta_path.insert(0, Block())

from hiveroute.cli import build_parser, main
from hiveroute.bench import plots
from hiveroute.config import RouterConfig
from hiveroute.errors import ConfigError
from hiveroute.gateway.server import start_router
build_parser()
assert not plots.available()

async def serve():
    running = await start_router(RouterConfig(engine=["http://127.0.0.1:9"], port=0).validate())
    await running.stop()
asyncio.run(serve())
for config in (
    {"state": "redis://127.0.0.1:9/0"},
    {"discovery": "kubernetes"},
    {"otlp_endpoint": "http://127.0.0.1:4318"},
):
    try:
        asyncio.run(start_router(RouterConfig(port=0, engine=["http://127.0.0.1:9"], **config).validate()))
    except ConfigError as exc:
        print(exc.message)
    else:
        raise SystemExit(f"{config} started without its extra")
try:
    from hiveroute.client import OpenAI
    OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x")
except ConfigError as exc:
    print(exc.message)
print("mcp exit", main(["mcp", "--router", "http://127.0.0.1:9"]))
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(BLOCKED))
print("loaded", loaded)
"""


def test_the_core_runs_without_optional_packages() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LEAN % (OPTIONAL,)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for extra in ("redis", "k8s", "otel", "openai"):
        assert f"pip install 'hiveroute[{extra}]'" in out, (extra, out)
    assert "mcp exit 2" in out and "pip install 'hiveroute[mcp]'" in done.stderr
    assert "loaded []" in out


def test_require_names_the_extra() -> None:
    assert require("json", "bench").__name__ == "json"
    with pytest.raises(MissingExtra, match=r"pip install 'hiveroute\[k8s\]'") as raised:
        require("no_such_module_for_hiveroute", "k8s")
    assert isinstance(raised.value, ConfigError)


def test_pyproject_keeps_optional_packages_out_of_the_core() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    for name in ("matplotlib", "kubernetes", "opentelemetry", "mcp", "redis", "openai", "beeai"):
        assert name not in core, name
    extras = project["optional-dependencies"]
    assert set(EXTRAS) <= set(extras)
    assert "hiveroute[all,beeai]" in extras["test"]  # scripts/test installs every extra
