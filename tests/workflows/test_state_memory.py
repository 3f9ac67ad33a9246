import pytest

from hiveroute.errors import ConfigError
from hiveroute.state import MemoryStateStore, open_state_store


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_strings_expire_and_set_if_absent_decides_races() -> None:
    clock = Clock()
    store = MemoryStateStore(clock=clock)
    assert await store.set_if_absent("home", "e1", ttl_s=10)
    assert not await store.set_if_absent("home", "e2", ttl_s=10)
    assert await store.get("home") == "e1"
    clock.now += 11
    assert await store.get("home") is None
    assert await store.set_if_absent("home", "e2")
    assert await store.get("home") == "e2"


async def test_compare_and_set_and_expire() -> None:
    clock = Clock()
    store = MemoryStateStore(clock=clock)
    assert await store.compare_and_set("k", None, "a")
    assert not await store.compare_and_set("k", "b", "c")
    assert await store.compare_and_set("k", "a", "c")
    assert await store.get("k") == "c"
    assert await store.expire("k", 1)
    clock.now += 2
    assert not await store.expire("k", 1)
    assert await store.delete("k") == 0


async def test_hashes_keep_their_ttl_and_count() -> None:
    clock = Clock()
    store = MemoryStateStore(clock=clock)
    await store.hset("h", {"a": "1"})
    await store.expire("h", 5)
    assert await store.hincrby("h", "n", 3) == 3
    assert await store.hincrbyfloat("h", "f", 0.5) == 0.5
    assert await store.hgetall("h") == {"a": "1", "n": "3", "f": "0.5"}
    assert await store.hdel("h", "a", "zz") == 1
    clock.now += 6  # writes kept the TTL set by expire
    assert await store.hgetall("h") == {}


async def test_bounded_lists_report_what_fell_off() -> None:
    store = MemoryStateStore()
    dropped = [await store.push_bounded("l", str(i), 3) for i in range(5)]
    assert dropped[:3] == [[], [], []] and dropped[3:] == [["0"], ["1"]]
    assert await store.lrange("l") == ["2", "3", "4"]
    assert await store.lrange("l", 1, 1) == ["3"]
    with pytest.raises(ValueError):
        await store.push_bounded("l", "x", 0)


async def test_scan_and_wrong_type() -> None:
    store = MemoryStateStore()
    await store.set("wf:doc:a", "1")
    await store.set("wf:doc:b", "1")
    await store.set("ctx:doc:c", "1")
    assert sorted(await store.scan("wf:doc:")) == ["wf:doc:a", "wf:doc:b"]
    with pytest.raises(TypeError):
        await store.hget("wf:doc:a", "x")


def test_open_state_store() -> None:
    assert open_state_store("memory").name == "memory"
    with pytest.raises(ConfigError):
        open_state_store("mysql://x")
