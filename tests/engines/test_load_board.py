"""The load board: workers of one host see each other's load on each engine."""

from __future__ import annotations

import logging
import multiprocessing
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from hiveroute.engines.engine import EngineLoad, EngineSpec, SharedEngineLoad
from hiveroute.engines.load_board import LoadBoard, board_path, name_hash
from hiveroute.engines.pool import EnginePool
from hiveroute.kvindex.index import KvIndex
from hiveroute.kvindex.tokenizer import BuiltinTokenizer
from hiveroute.metadata import RequestMetadata
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.base import CycleState, RoutingRequest
from hiveroute.routing.costs import CostModel
from hiveroute.routing.live_set import LiveSet
from hiveroute.routing.registry import PluginContext, build_policy

A, B = "10.0.0.1:8000", "10.0.0.2:8000"  # engines, by name (host:port)


@pytest.fixture
def path(tmp_path: Path) -> str:
    found = board_path(str(tmp_path))
    LoadBoard.create(found, workers=2)
    return found


def pool_on(board: LoadBoard, *names: str) -> EnginePool:
    """A worker's pool of the engines `names`, on the board."""
    return EnginePool([EngineSpec(f"http://{name}") for name in names], board=board)


def load(pool: EnginePool, name: str) -> EngineLoad:
    engine = pool.get(name)
    assert engine is not None
    return engine.load


def test_two_workers_see_each_others_requests_in_flight(path: str) -> None:
    one, two = LoadBoard(path, 0), LoadBoard(path, 1)
    first, second = pool_on(one, A, B), pool_on(two, A, B)
    load(first, A).in_flight += 3
    load(second, A).in_flight += 2
    load(second, B).in_flight += 1
    for pool in (first, second):
        a, b = pool.get(A), pool.get(B)
        assert a is not None and b is not None
        assert (a.load.queue_depth, b.load.queue_depth) == (5, 1)  # the router's, either way
        assert a.load.router_in_flight == 5
    # each worker's own count (what it serves, what its metrics sum) stays its own
    assert [load(p, A).in_flight for p in (first, second)] == [3, 2]
    load(second, A).in_flight -= 2
    assert load(first, A).queue_depth == 3


def test_a_name_has_one_slot_whichever_worker_joins_it_first(path: str) -> None:
    one, two = LoadBoard(path, 0), LoadBoard(path, 1)
    names = [f"http://10.0.0.{i}:8000" for i in range(40)]
    for name in names:
        one.join(name)
    for name in reversed(names):
        two.join(name)
    slots_one = {name: one._joined[name][0] for name in names}
    slots_two = {name: two._joined[name][0] for name in names}
    assert slots_one == slots_two
    assert len(set(slots_one.values())) == len(names)
    assert all(name_hash(name) > 1 for name in names)  # never a marker


def test_a_full_table_counts_new_engines_locally_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = board_path(str(tmp_path))
    LoadBoard.create(path, workers=2, slots=2)
    one, two = LoadBoard(path, 0), LoadBoard(path, 1)
    names = [f"10.0.0.{i}:8000" for i in range(4)]
    with caplog.at_level(logging.WARNING, logger="hiveroute.engines"):
        first, second = pool_on(one, *names), pool_on(two, *names)
    assert sum("slots are taken" in r.message for r in caplog.records) == 2  # once per worker
    shared = [n for n in names if isinstance(load(first, n), SharedEngineLoad)]
    local = [n for n in names if n not in shared]
    assert len(shared) == 2 and len(local) == 2
    for name in names:  # each worker still routes to every engine
        load(first, name).in_flight += 1
        load(second, name).in_flight += 1
    for name in shared:
        assert load(first, name).queue_depth == 2
    for name in local:
        assert type(load(first, name)) is EngineLoad
        assert load(first, name).queue_depth == 1
    backlog = PrefillBacklog(clock=lambda: 0.0, board=one)
    backlog.add(local[0], 50, CycleState())
    assert backlog.of(local[0]) == (50, 1)


def test_an_engine_that_leaves_takes_its_counts_with_it(path: str) -> None:
    one, two = LoadBoard(path, 0), LoadBoard(path, 1)
    first, second = pool_on(one, A), pool_on(two, A)
    leaving = first.get(A)
    assert leaving is not None
    leaving.load.in_flight += 4
    backlog = PrefillBacklog(clock=lambda: 0.0, board=one)
    backlog.add(A, 300, state := CycleState())
    watcher = PrefillBacklog(clock=lambda: 0.0, board=two)
    assert load(second, A).queue_depth == 4
    assert watcher.of(A) == (300, 1)
    first.remove(A)
    assert load(second, A).queue_depth == 0
    assert watcher.of(A) == (0, 0)
    # the requests still out on it end later: nothing reaches the board any more
    leaving.load.in_flight -= 1
    backlog.settle(state)
    assert load(second, A).queue_depth == 0
    # it comes back: counted afresh, in the same slot as the sibling's
    first.add(EngineSpec(f"http://{A}"))
    load(first, A).in_flight += 1
    assert load(second, A).queue_depth == 1
    assert one._joined[A][0] == two._joined[A][0]


def test_a_slot_is_given_back_when_every_worker_has_let_its_engine_go(tmp_path: Path) -> None:
    path = board_path(str(tmp_path))
    LoadBoard.create(path, workers=2, slots=4)
    one, two = LoadBoard(path, 0), LoadBoard(path, 1)
    # two names that start probing at the same slot: the second lands past the first
    by_start: dict[int, list[str]] = {}
    for i in range(100):
        by_start.setdefault(name_hash(f"e{i}") % 4, []).append(f"e{i}")
    first_name, second_name = next(names for names in by_start.values() if len(names) >= 2)[:2]
    one.join(first_name)
    one.join(second_name)
    two.join(first_name)
    one.leave(first_name)
    two.leave(first_name)  # the last holder: the slot is free
    # the name past the freed slot is still found there by a worker that joins it now
    assert two.join(second_name) is not None
    assert two._joined[second_name][0] == one._joined[second_name][0]
    # churn does not fill the table: 20 engines come and go through 4 slots
    for i in range(20):
        assert one.join(f"pod-{i}") is not None
        one.leave(f"pod-{i}")


def test_a_replaced_engine_no_longer_writes_to_its_successor(path: str) -> None:
    one, two = LoadBoard(path, 0), LoadBoard(path, 1)
    first, second = pool_on(one, A), pool_on(two, A)
    old = first.get(A)
    assert old is not None
    old.load.in_flight += 2
    first.add(
        EngineSpec(f"http://{A}", events="tcp://10.0.0.1:5557")
    )  # same name, new spec: replaced
    new = first.get(A)
    assert new is not None and new is not old
    new.load.in_flight += 1
    old.load.in_flight -= 2  # the old one's requests end
    assert load(second, A).queue_depth == 1


def test_a_scrape_counts_every_workers_requests_as_the_routers(path: str) -> None:
    one, two = LoadBoard(path, 0), LoadBoard(path, 1)
    first, second = pool_on(one, A), pool_on(two, A)
    mine, sibling = first.get(A), second.get(A)
    assert mine is not None and sibling is not None
    mine.load.in_flight = 2
    sibling.load.in_flight = 3
    text = 'vllm:num_requests_running{model_name="m"} 6\nvllm:num_requests_waiting 1\n'
    first._apply_metrics(mine, text)
    assert mine.load.in_flight_at_scrape == 5
    assert mine.load.foreign == 2  # 7 at the engine, 5 of them the router's
    assert mine.load.queue_depth == 7


def test_the_backlog_counts_and_drains_the_siblings_share(path: str) -> None:
    now = [100.0]
    one, two = LoadBoard(path, 0), LoadBoard(path, 1)
    for board in (one, two):  # each worker's pool joins the engines
        pool_on(board, A, B)
    mine = PrefillBacklog(clock=lambda: now[0], board=one)
    theirs = PrefillBacklog(clock=lambda: now[0], board=two)
    mine.add(A, 1000, CycleState())
    now[0] = 101.0
    theirs.add(A, 400, sibling := CycleState())
    theirs.add(A, 100, CycleState())
    assert mine.of(A) == theirs.of(A) == (1500, 3)
    assert mine.of(B) == (0, 0)
    # at 1 ms a token the engine works through the 1500 tokens once, counted from the latest
    # start a worker saw (theirs, at 101 s): not each share from its own start
    now[0] = 101.2
    assert mine.remaining(A) == 1500
    assert mine.remaining(A, 0.001) == pytest.approx(1500 - 200)
    assert theirs.remaining(A, 0.001) == mine.remaining(A, 0.001)
    theirs.settle(sibling)  # its first token: what is left starts now
    assert mine.of(A) == (1100, 2)
    assert mine.remaining(A, 0.001) == pytest.approx(1100)


def routing_request() -> RoutingRequest:
    body = {"model": "m", "prompt": " ".join(f"w{i}" for i in range(100)), "stream": True}
    return RoutingRequest("r", "/v1/completions", body, RequestMetadata())


@pytest.mark.parametrize("busy_first", [True, False])
async def test_policies_route_around_the_siblings_load(path: str, busy_first: bool) -> None:
    one, two = LoadBoard(path, 0), LoadBoard(path, 1)
    names = (A, B) if busy_first else (B, A)  # the busy engine first or last: no tie decides
    first, second = pool_on(one, *names), pool_on(two, *names)
    load(second, A).in_flight += 5
    least_load = build_policy("least_load", PluginContext(first))
    decision, _ = await least_load.route(routing_request(), first.candidates("m"))
    assert decision.engine.name == B
    # the kv policy: no requests in flight, but a sibling's long prompts wait for A's prefill
    load(second, A).in_flight -= 5
    theirs = PrefillBacklog(clock=lambda: 0.0, board=two)
    theirs.add(A, 20_000, CycleState())
    costs = CostModel(backlog=PrefillBacklog(clock=lambda: 0.0, board=one))
    context = PluginContext(first, tokenizer=BuiltinTokenizer(), kv_index=KvIndex(), costs=costs)
    decision, _ = await build_policy("kv", context).route(routing_request(), first.candidates("m"))
    assert decision.engine.name == B


def test_the_live_set_counts_the_blocks_its_siblings_made_live(path: str) -> None:
    now = [100.0]
    one, two = LoadBoard(path, 0), LoadBoard(path, 1)
    for board in (one, two):
        pool_on(board, A, B)
    mine = LiveSet(window_s=30.0, clock=lambda: now[0], board=one)
    theirs = LiveSet(window_s=30.0, clock=lambda: now[0], board=two)
    theirs.touch(A, list(range(10)))
    assert (mine.blocks(A), mine.blocks(B)) == (10, 0)
    now[0] = 110.0
    mine.touch(A, list(range(100, 105)))
    assert mine.blocks(A) == theirs.blocks(A) == 15
    # the sibling routes nothing more: its count, taken over a window ago, expired with its
    # blocks; this worker's own, touched later, are still live
    now[0] = 131.0
    assert mine.blocks(A) == 5
    theirs.touch(B, [7])
    theirs.forget(B)  # the engine lost its cache: the siblings no longer count what it held
    assert mine.blocks(B) == 0


@pytest.mark.parametrize("filled_first", [True, False])
async def test_a_new_context_goes_where_no_sibling_made_blocks_live(
    path: str, filled_first: bool
) -> None:
    one, two = LoadBoard(path, 0), LoadBoard(path, 1)
    names = (A, B) if filled_first else (B, A)  # the filled engine first or last: no tie decides
    first, _ = pool_on(one, *names), pool_on(two, *names)
    LiveSet(board=two).touch(A, list(range(2000)))  # the sibling just placed a context on A
    costs = CostModel(live=LiveSet(board=one))
    context = PluginContext(first, tokenizer=BuiltinTokenizer(), kv_index=KvIndex(), costs=costs)
    decision, _ = await build_policy("kv", context).route(routing_request(), first.candidates("m"))
    assert decision.engine.name == B


def _sibling(path: str, pipe: Connection) -> None:
    """Worker 1, in its own process: 2 requests in flight on A, 700 tokens to prefill there."""
    board = LoadBoard(path, 1)
    pool = EnginePool([EngineSpec(f"http://{A}")], board=board)
    backlog = PrefillBacklog(board=board)
    engine = pool.get(A)
    assert engine is not None
    engine.load.in_flight += 2
    backlog.add(A, 700, CycleState())
    pipe.send("published")
    pipe.recv()  # hold until the parent has looked


def test_a_sibling_process_load_is_seen_across_processes(path: str) -> None:
    board = LoadBoard(path, 0)
    pool = EnginePool([EngineSpec(f"http://{A}")], board=board)
    backlog = PrefillBacklog(board=board)
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    child = context.Process(target=_sibling, args=(path, theirs))
    child.start()
    try:
        assert mine.poll(120), "the sibling process did not start"
        assert mine.recv() == "published"
        engine = pool.get(A)
        assert engine is not None
        engine.load.in_flight += 1
        assert engine.load.queue_depth == 3
        assert backlog.of(A) == (700, 1)
        queue, to_prefill = backlog.features(engine, 50)
        assert (queue, to_prefill) == (2, 750)  # 3 in flight, 1 of them still prefilling
        mine.send("done")
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
