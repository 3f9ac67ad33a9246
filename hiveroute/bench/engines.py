"""Engines for a benchmark: a simulated fleet (default) or real vLLM, started and stopped here."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hiveroute.bench.procs import ChildProcess, wait_http_ok
from hiveroute.errors import ConfigError

ENGINE_KINDS = ("sim", "vllm")


@dataclass
class EngineOptions:
    kind: str = "sim"
    count: int = 2
    preset: str = "llama-8b-h100"
    block_size: int = 16
    sim_options: dict[str, Any] = field(default_factory=dict)  # more SimConfig fields
    startup_timeout_s: float = 60.0
    vllm_layers: int = 2  # the random-weight model real vLLM serves: deeper and wider
    vllm_hidden: int = 256  # makes prefill cost real time on the CPU


@dataclass
class Fleet:
    """Running engines: their ``--engine`` spec texts (with events) and plain URLs."""

    specs: list[str]
    urls: list[str]
    kind: str
    _child: ChildProcess | None = None
    _handle: Any = None

    def cpu_seconds(self) -> float | None:
        """CPU the simulated engines' process has used so far (None: real vLLM, or gone)."""
        return self._child.cpu_seconds() if self._child is not None else None

    async def stop(self) -> None:
        if self._child is not None:
            await self._child.stop()
        if self._handle is not None:
            await self._handle.stop()


async def start_fleet(options: EngineOptions, log_path: Path) -> Fleet:
    if options.kind == "sim":
        return await _start_sim(options, log_path)
    if options.kind == "vllm":
        return await _start_vllm(options, log_path)
    raise ConfigError(f"unknown engine kind {options.kind!r}; choose {', '.join(ENGINE_KINDS)}")


async def _start_sim(options: EngineOptions, log_path: Path) -> Fleet:
    argv = [
        sys.executable,
        "-m",
        "hiveroute.bench.sim_process",
        "--engines",
        str(options.count),
        "--block-size",
        str(options.block_size),
        "--preset",
        options.preset,
        "--options",
        json.dumps(options.sim_options),
    ]
    child = await ChildProcess.start(argv, log_path, "simulated engines", stdout_pipe=True)
    assert child.proc.stdout is not None
    try:
        line = await asyncio.wait_for(child.proc.stdout.readline(), options.startup_timeout_s)
        info = json.loads(line) if line else None
    except (TimeoutError, ValueError):
        info = None
    if not info:
        await child.stop()
        raise RuntimeError(f"simulated engines did not start; log {log_path}:\n{child.log_tail()}")
    fleet = Fleet(specs=info["specs"], urls=info["urls"], kind="sim", _child=child)
    try:
        for url in fleet.urls:
            await wait_http_ok(url + "/health", child, options.startup_timeout_s, "sim engine")
    except BaseException:
        await fleet.stop()
        raise
    return fleet


async def _start_vllm(options: EngineOptions, log_path: Path) -> Fleet:
    from hiveroute.engines import vllm_local

    if not vllm_local.vllm_available():
        raise ConfigError(
            f"no vLLM environment at {vllm_local.vllm_python()}; run scripts/ensure-vllm or set "
            "HIVEROUTE_VLLM_PYTHON"
        )
    spec = vllm_local.TinyModelSpec(
        layers=options.vllm_layers,
        hidden=options.vllm_hidden,
        heads=max(1, options.vllm_hidden // 64),
    )
    model_dir = await asyncio.to_thread(vllm_local.make_tiny_model, spec)
    servers = await vllm_local.start_vllm_servers(options.count, model_dir, log_dir=log_path.parent)
    return Fleet(
        specs=[_spec_text(s.spec) for s in servers],
        urls=[s.url for s in servers],
        kind="vllm",
        _handle=_VllmHandle(servers),
    )


def _spec_text(spec: Any) -> str:
    parts = [spec.url]
    if spec.events:
        parts.append(f"events={spec.events}")
    if spec.replay:
        parts.append(f"replay={spec.replay}")
    return ",".join(parts)


class _VllmHandle:
    def __init__(self, servers: list[Any]) -> None:
        self.servers = servers

    async def stop(self) -> None:
        for server in self.servers:
            await asyncio.to_thread(server.stop)
