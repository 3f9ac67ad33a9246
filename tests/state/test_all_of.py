"""`all_of`: independent state calls, pipelined to a remote store, in turn on a local one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hiveroute.state.memory import MemoryStateStore
from hiveroute.state.store import all_of


async def test_an_in_process_store_runs_the_calls_in_turn_without_tasks() -> None:
    store = MemoryStateStore()
    tasks_before = len(asyncio.all_tasks())
    seen: list[int] = []

    async def call(n: int) -> int:
        seen.append(len(asyncio.all_tasks()))
        return n * 10

    assert await all_of(store, call(1), call(2), store.hset("h", {"a": "1"})) == [10, 20, None]
    assert seen == [tasks_before, tasks_before]  # no task was made for them
    assert await store.hget("h", "a") == "1"


async def test_a_failing_call_leaves_no_later_call_unawaited() -> None:
    store = MemoryStateStore()
    later: list[Any] = []

    async def boom() -> None:
        raise RuntimeError("store down")

    async def never() -> None:  # pragma: no cover - closed, not run
        later.append("ran")

    pending = never()
    with pytest.raises(RuntimeError, match="store down"):
        await all_of(store, boom(), pending)
    assert later == []
    assert pending.cr_frame is None  # closed: no "never awaited" warning


class _RemoteStore(MemoryStateStore):
    in_process = False


async def test_a_remote_store_gets_the_calls_at_once() -> None:
    store = _RemoteStore()
    started: list[str] = []
    release = asyncio.Event()

    async def call(name: str) -> str:
        started.append(name)
        await release.wait()
        return name

    running = asyncio.ensure_future(all_of(store, call("a"), call("b")))
    while len(started) < 2:  # both start before either finishes: they run concurrently
        await asyncio.sleep(0)
    release.set()
    assert await running == ["a", "b"]


async def test_calls_in_flight_are_awaited_in_turn_and_no_failure_goes_unseen() -> None:
    """A shared store's calls are futures, sent when made: no task per call, and when one
    fails the others' failures are marked seen (no 'exception was never retrieved')."""
    store = _RemoteStore()
    loop = asyncio.get_running_loop()
    first, second, third = loop.create_future(), loop.create_future(), loop.create_future()
    running = asyncio.ensure_future(all_of(store, first, second, third))
    await asyncio.sleep(0)
    tasks = len(asyncio.all_tasks())
    first.set_result(1)
    second.set_exception(ValueError("no such hash"))
    with pytest.raises(ValueError, match="no such hash"):
        await running
    assert len(asyncio.all_tasks()) <= tasks  # no task was made per call
    unseen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unseen.append(context))
    try:
        third.set_exception(ValueError("also failed"))
        await asyncio.sleep(0)  # the done callback runs
        del first, second, third, running
        import gc

        gc.collect()
        assert unseen == []
    finally:
        loop.set_exception_handler(None)
