"""Health under `serve --workers`: one worker checks each engine, the others read its rounds.

Each worker asked every engine /health, /v1/models and /metrics every round and parsed the
answer: N workers cost the engines and the router N times one worker's checks."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hiveroute.engines.client import EngineClient
from hiveroute.engines.engine import Engine, EngineSpec
from hiveroute.engines.load_board import CHECKED_AT, LoadBoard, board_path
from hiveroute.engines.pool import QUIET_ROUNDS, EnginePool
from tests.support.fake_engine import FakeEngine


@pytest.fixture
async def fake() -> AsyncIterator[FakeEngine]:
    engine = await FakeEngine().start()
    yield engine
    await engine.stop()


@pytest.fixture
async def client() -> AsyncIterator[EngineClient]:
    engine_client = EngineClient()
    await engine_client.start()
    yield engine_client
    await engine_client.stop()


@pytest.fixture
def boards(tmp_path: Path) -> list[LoadBoard]:
    path = board_path(str(tmp_path))
    LoadBoard.create(path, workers=2)
    return [LoadBoard(path, 0), LoadBoard(path, 1)]


def worker(board: LoadBoard, client: EngineClient, fake: FakeEngine) -> EnginePool:
    return EnginePool([EngineSpec(fake.url)], client=client, board=board, health_interval_s=60)


def the_engine(pool: EnginePool) -> Engine:
    (engine,) = pool.engines
    return engine


def asked(fake: FakeEngine, what: str = "/metrics") -> int:
    """How often the engine was asked for `what`; for /metrics (a round's last request): the
    health rounds it answered."""
    return sum(1 for _, path, _ in fake.calls if path == what)


async def test_one_worker_checks_and_the_other_reads_its_round(
    boards: list[LoadBoard],
    client: EngineClient,
    fake: FakeEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hiveroute.engines")
    prober, follower = (worker(b, client, fake) for b in boards)
    fake.behaviour.running, fake.behaviour.waiting = 3, 2
    await prober.health_round()
    await follower.health_round()
    assert asked(fake) == 1  # the prober's round alone
    engine = the_engine(follower)
    assert engine.healthy and engine.models == {"m"}  # listed once, the prober having seen them
    assert (engine.load.running, engine.load.waiting, engine.load.kv_usage) == (3, 2, 0.25)

    fake.behaviour.healthy = False  # down: the prober finds it (two failures), the other reads
    for _ in range(2):
        await prober.health_round()
    await follower.follow_board()
    assert not the_engine(prober).healthy and not engine.healthy
    assert engine.last_error == "RuntimeError: /health answered 503"
    assert asked(fake) == 1  # a failed /health asks no /metrics

    fake.behaviour.healthy = True
    await prober.health_round()
    await follower.follow_board()
    assert engine.healthy and asked(fake) == 2
    lines = [r.getMessage() for r in caplog.records]
    assert sum("is down" in line for line in lines) == 1  # the host's log says it once
    assert sum("is back" in line for line in lines) == 1


async def test_a_worker_that_took_an_engine_out_waits_for_a_later_round(
    boards: list[LoadBoard],
    client: EngineClient,
    fake: FakeEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request that failed on the engine takes it out at once; the prober's round from
    before that failure does not put it back, a round after it does."""
    prober, follower = (worker(b, client, fake) for b in boards)
    await prober.health_round()
    engine = the_engine(follower)
    follower.report_failure(engine, "engine closed the connection")
    await follower.follow_board()
    assert not engine.healthy
    await prober.health_round()
    with caplog.at_level(logging.INFO, logger="hiveroute.engines"):
        await follower.follow_board()
    assert engine.healthy
    assert [r.getMessage() for r in caplog.records] == [
        f"engine {engine.name} taken out: engine closed the connection",
        f"engine {engine.name} is back",  # the prober never saw it out: this worker says so
    ]


async def test_the_checks_pass_on_when_the_prober_lets_the_engine_go(
    boards: list[LoadBoard], client: EngineClient, fake: FakeEngine
) -> None:
    prober, follower = (worker(b, client, fake) for b in boards)
    await prober.health_round()
    await follower.health_round()
    assert asked(fake) == 1
    prober.remove(the_engine(prober).name)
    await follower.health_round()
    assert asked(fake) == 2  # the follower is the engine's prober now


async def test_a_quiet_prober_is_not_waited_for(
    boards: list[LoadBoard], client: EngineClient, fake: FakeEngine
) -> None:
    """A prober whose rounds stopped (its loop stuck) leaves the engine to the others' own
    checks after QUIET_ROUNDS rounds; its records are not taken meanwhile."""
    prober, follower = (worker(b, client, fake) for b in boards)
    await prober.health_round()
    cell = boards[0].cell(the_engine(prober).name)
    assert cell is not None
    quiet_for = QUIET_ROUNDS * follower.health_interval_s + client.timeouts.health_s + 1
    cell.health[CHECKED_AT] = time.monotonic() - quiet_for
    await follower.health_round()
    assert asked(fake) == 2


async def test_a_follower_lists_the_models_again_when_the_prober_saw_them_change(
    boards: list[LoadBoard], client: EngineClient, fake: FakeEngine
) -> None:
    prober, follower = (worker(b, client, fake) for b in boards)
    await prober.health_round()
    await follower.health_round()
    assert the_engine(follower).models == {"m"}
    lists = asked(fake, "/v1/models")
    fake.behaviour.models = ["m", "m-lora"]  # an adapter loaded at run time
    await prober.health_round()
    await follower.follow_board()
    assert the_engine(follower).models == {"m", "m-lora"}
    assert asked(fake, "/v1/models") == lists + 2
    await prober.health_round()
    await follower.follow_board()  # unchanged: not listed again
    assert asked(fake, "/v1/models") == lists + 3


async def test_without_a_board_every_pool_checks_its_engines(
    client: EngineClient, fake: FakeEngine
) -> None:
    pools = [EnginePool([EngineSpec(fake.url)], client=client) for _ in range(2)]
    for pool in pools:
        await pool.health_round()
    assert asked(fake) == 2
