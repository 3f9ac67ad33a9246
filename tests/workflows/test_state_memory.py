"""The state-store contract, run against the memory store and against a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from hiveroute.errors import ConfigError
from hiveroute.state import MemoryStateStore, StateStore, open_state_store


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Subject:
    store: StateStore
    advance: Callable[[float], Awaitable[None]]  # let `seconds` pass for TTLs


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.services)])
async def subject(request: pytest.FixtureRequest) -> AsyncIterator[Subject]:
    if request.param == "memory":
        clock = Clock()

        async def tick(seconds: float) -> None:
            clock.now += seconds

        yield Subject(MemoryStateStore(clock=clock), tick)
        return
    server: Any = request.getfixturevalue("redis_server")
    store = open_state_store(server.url + "?timeout_s=5")  # a busy CI machine is no outage

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(seconds)

    yield Subject(store, sleep)
    assert getattr(store, "up", True), "the Redis store fell back to local state"
    await store.close()


async def test_strings_expire_and_set_if_absent_decides_races(subject: Subject) -> None:
    store = subject.store
    assert await store.set_if_absent("home", "e1", ttl_s=0.3)
    assert not await store.set_if_absent("home", "e2", ttl_s=0.3)
    assert await store.get("home") == "e1"
    await subject.advance(0.5)
    assert await store.get("home") is None
    assert await store.set_if_absent("home", "e2")
    assert await store.get("home") == "e2"


async def test_compare_and_set_and_expire(subject: Subject) -> None:
    store = subject.store
    assert await store.compare_and_set("k", None, "a")
    assert not await store.compare_and_set("k", None, "b")
    assert not await store.compare_and_set("k", "b", "c")
    assert await store.compare_and_set("k", "a", "c")
    assert await store.get("k") == "c"
    assert await store.expire("k", None)  # no TTL to remove: still True, the key exists
    assert await store.expire("k", 0.2)
    await subject.advance(0.4)
    assert not await store.expire("k", 1)
    assert await store.delete("k") == 0
    await store.set("x", "1")
    await store.set("y", "2", ttl_s=60)
    assert await store.delete("x", "y", "z") == 2


async def test_hashes_keep_their_ttl_and_count(subject: Subject) -> None:
    store = subject.store
    await store.hset("h", {"a": "1"})
    await store.expire("h", 0.3)
    assert await store.hincrby("h", "n", 3) == 3
    assert await store.hincrby("h", "n", -1) == 2
    assert await store.hincrbyfloat("h", "f", 0.5) == 0.5
    assert await store.hget("h", "a") == "1"
    assert await store.hget("h", "nope") is None
    assert await store.hgetall("h") == {"a": "1", "n": "2", "f": "0.5"}
    assert await store.hdel("h", "a", "zz") == 1
    await subject.advance(0.5)  # writes kept the TTL set by expire
    assert await store.hgetall("h") == {}
    await store.hset("g", {"only": "x"})
    assert await store.hdel("g", "only") == 1
    assert await store.scan("g") == []  # a hash emptied by hdel is gone


async def test_bounded_lists_report_what_fell_off(subject: Subject) -> None:
    store = subject.store
    dropped = [await store.push_bounded("l", str(i), 3) for i in range(5)]
    assert dropped[:3] == [[], [], []] and dropped[3:] == [["0"], ["1"]]
    assert await store.lrange("l") == ["2", "3", "4"]
    assert await store.lrange("l", 1, 1) == ["3"]
    assert await store.lrange("missing") == []
    with pytest.raises(ValueError):
        await store.push_bounded("l", "x", 0)


async def test_scan_and_wrong_type(subject: Subject) -> None:
    store = subject.store
    await store.set("wf:doc:a", "1")
    await store.set("wf:doc:b", "1")
    await store.set("ctx:doc:c", "1")
    await store.set("wf:doc*x", "1")  # glob characters in keys match only themselves
    assert sorted(await store.scan("wf:doc:")) == ["wf:doc:a", "wf:doc:b"]
    assert await store.scan("wf:doc*") == ["wf:doc*x"]
    assert len(await store.scan("wf:", limit=2)) == 2
    with pytest.raises(TypeError):
        await store.hget("wf:doc:a", "x")
    with pytest.raises(TypeError):
        await store.push_bounded("wf:doc:a", "x", 3)


def test_open_state_store() -> None:
    assert open_state_store("memory").name == "memory"
    with pytest.raises(ConfigError):
        open_state_store("mysql://x")
