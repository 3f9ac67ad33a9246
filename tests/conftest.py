"""Shared fixtures: fake engines, routers on free loopback ports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from hiveroute.config import RouterConfig
from hiveroute.server import RunningRouter, start_router
from tests.support.fake_engine import FakeEngine


@pytest.fixture
async def fake_engines() -> AsyncIterator[list[FakeEngine]]:
    engines = [FakeEngine(f"e{i}") for i in range(2)]
    for engine in engines:
        await engine.start()
    yield engines
    for engine in engines:
        engine.release.set()
        await engine.stop()


RouterFactory = Callable[..., Awaitable[RunningRouter]]


@pytest.fixture
async def router_factory() -> AsyncIterator[RouterFactory]:
    started: list[RunningRouter] = []

    async def make(engines: list[str], **overrides: Any) -> RunningRouter:
        options: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "health_interval_s": 0.2}
        options.update(overrides)
        running = await start_router(RouterConfig(engine=engines, **options).validate())
        started.append(running)
        return running

    yield make
    for running in started:
        await running.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(scope="session")
def tiny_model_dir() -> Any:
    """A tiny random-weight Llama with its tokenizer (built once, cached on disk)."""
    from hiveroute.engines.vllm_local import make_tiny_model, vllm_available

    if not vllm_available():
        pytest.fail("real vLLM is not installed: run scripts/ensure-vllm (scripts/test does)")
    return make_tiny_model()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One real vLLM server for the whole session (starting one takes ~30 s on the CPU).

    Tests that restart or evict must start their own with hiveroute.engines.vllm_local.
    """
    from tests.support.vllm import running_vllm

    with running_vllm(tiny_model_dir, tmp_path_factory.mktemp("vllm") / "vllm.log") as server:
        yield server


@pytest.fixture
def redis_server(tmp_path: Any) -> Any:
    """A real redis-server on a free port, stopped after the test."""
    from hiveroute.bench.redis_server import RedisServer

    server = RedisServer(workdir=tmp_path)
    server.start()
    yield server
    server.stop()
