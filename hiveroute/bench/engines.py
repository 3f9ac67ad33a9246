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


@dataclass
class Fleet:
    """Running engines: their ``--engine`` spec texts (with events) and plain URLs."""

    specs: list[str]
    urls: list[str]
    kind: str
    _child: ChildProcess | None = None
    _handle: Any = None

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
    except (asyncio.TimeoutError, ValueError):
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
    try:
        from hiveroute.engines import vllm_local  # type: ignore[attr-defined]
    except ImportError:
        raise ConfigError(
            "real vLLM engines need hiveroute.engines.vllm_local, which this build lacks"
        ) from None
    handle = await vllm_local.start_fleet(  # the lead's launcher (see hiveroute/engines)
        count=options.count, log_dir=log_path.parent
    )
    return Fleet(specs=list(handle.spec_texts()), urls=list(handle.urls), kind="vllm", _handle=handle)
