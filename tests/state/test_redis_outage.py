"""The Redis store when Redis goes away: local service, one log line each way, metrics, and a
reconciliation that keeps other replicas' winners."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from hiveroute.bench.redis_server import RedisServer
from hiveroute.errors import ConfigError
from hiveroute.observability.metrics import StateMetrics
from hiveroute.runtime import free_port
from hiveroute.state.redis import BackendDown, RedisStateStore, parse_redis_url
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.services

FAST = "?timeout_s=1&probe_s=0.1"  # no spurious outage on a busy machine


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, {"backend": "redis", **labels}) or 0.0


async def wait_until_up(store: RedisStateStore) -> None:
    for _ in range(200):
        if store.up:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the store did not switch back to Redis")


@pytest.fixture
async def direct(redis_server: RedisServer) -> AsyncIterator[Any]:
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


def outage_lines(caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    down = [r for r in caplog.records if "is unreachable" in r.getMessage()]
    back = [r for r in caplog.records if "is back after" in r.getMessage()]
    return len(down), len(back)


async def test_partition_serves_locally_and_reconciles_without_overwriting_winners(
    redis_server: RedisServer, direct: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hiveroute.state")
    proxy = TcpProxy("127.0.0.1", redis_server.port)
    await proxy.start()
    registry = CollectorRegistry()
    mine = RedisStateStore(proxy.url + FAST, metrics=StateMetrics(registry))
    other = RedisStateStore(redis_server.url + "?timeout_s=5")  # another replica, still connected
    try:
        await mine.connect()
        assert sample(registry, "hiveroute_state_backend_up") == 1
        assert await mine.set_if_absent("wf:home:old", "e1", ttl_s=60)
        await mine.hset("wf:stats:old", {"last": "1"})
        assert await mine.hincrby("wf:stats:old", "requests", 1) == 1
        await mine.push_bounded("wf:order:old", "r1", 3)

        proxy.set_mode("hang")  # Redis stops answering this replica
        burst = await asyncio.gather(*(mine.hincrby("wf:stats:old", "burst", 1) for _ in range(20)))
        assert sorted(burst) == list(range(1, 21))  # one timed out; all were served locally
        assert not mine.up
        assert await mine.hincrby("wf:stats:old", "requests", 2) == 3
        bytes_when_down = proxy.bytes_from_client
        assert await mine.set_if_absent("wf:home:new", "mine", ttl_s=60)  # claimed locally
        assert await mine.set_if_absent("wf:home:fresh", "mine")
        await mine.hset("wf:stats:old", {"last": "2"})
        await mine.hincrbyfloat("wf:stats:old", "service", 1.5)
        await mine.push_bounded("wf:order:old", "r2", 3)
        await mine.push_bounded("wf:order:old", "r3", 3)
        await mine.delete("wf:home:old")
        assert await mine.get("wf:home:new") == "mine"
        assert await mine.hgetall("wf:stats:old") == {
            "last": "2",
            "requests": "3",
            "service": "1.5",
            "burst": "20",
        }
        assert proxy.bytes_from_client == bytes_when_down  # down: no call waits on Redis
        assert sample(registry, "hiveroute_state_backend_up") == 0
        assert sample(registry, "hiveroute_state_errors_total", reason="timeout") >= 1
        assert sample(registry, "hiveroute_state_local_operations_total") >= 8

        # Meanwhile another replica claims the same home and counts its own requests.
        assert await other.set_if_absent("wf:home:new", "theirs", ttl_s=60)
        assert await other.hincrby("wf:stats:old", "requests", 5) == 6

        proxy.set_mode("open")
        await wait_until_up(mine)
        assert await direct.get("hiveroute:wf:home:new") == "theirs"  # the winner stays
        assert await mine.get("wf:home:new") == "theirs"
        assert mine.local.entry("wf:home:new")[0] == "theirs"  # the local copy took it
        assert await direct.get("hiveroute:wf:home:fresh") == "mine"
        assert await direct.hgetall("hiveroute:wf:stats:old") == {
            "last": "2",
            "requests": "8",  # 1 + 2 here + 5 there: increments commute
            "service": "1.5",
            "burst": "20",
        }
        assert await direct.lrange("hiveroute:wf:order:old", 0, -1) == ["r1", "r2", "r3"]
        assert await direct.get("hiveroute:wf:home:old") is None
        assert sample(registry, "hiveroute_state_backend_up") == 1
        assert sample(registry, "hiveroute_state_reconciled_keys_total", result="conflict") == 1
        assert sample(registry, "hiveroute_state_reconciled_keys_total", result="applied") >= 4
        assert outage_lines(caplog) == (1, 1)  # once per transition, not per operation
    finally:
        await mine.close()
        await other.close()
        await proxy.stop()


async def test_redis_restarted_empty_gets_the_replicas_copy_back(
    redis_server: RedisServer, direct: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hiveroute.state")
    registry = CollectorRegistry()
    store = RedisStateStore(redis_server.url + FAST, metrics=StateMetrics(registry))
    try:
        await store.connect()
        await store.set("wf:doc:w", '{"id":"w"}', ttl_s=120)
        assert await store.set_if_absent("wf:home:w", "e2", ttl_s=120)
        await store.hset("wf:agents:w", {"planner": "planner"})
        await store.push_bounded("wf:order:w", "r1", 10)
        redis_server.stop()
        await store.push_bounded("wf:order:w", "r2", 10)  # fails, then local
        assert not store.up
        await store.hincrby("wf:stats:w", "requests", 2)
        redis_server.start()  # same port, no data
        await wait_until_up(store)
        assert await direct.get("hiveroute:wf:home:w") == "e2"
        assert await direct.get("hiveroute:wf:doc:w") == '{"id":"w"}'
        assert 0 < await direct.pttl("hiveroute:wf:doc:w") <= 120_000
        assert await direct.hgetall("hiveroute:wf:agents:w") == {"planner": "planner"}
        assert await direct.hgetall("hiveroute:wf:stats:w") == {"requests": "2"}
        assert await direct.lrange("hiveroute:wf:order:w", 0, -1) == ["r1", "r2"]
        assert sample(registry, "hiveroute_state_reconciled_keys_total", result="restored") == 5
        assert outage_lines(caplog) == (1, 1)
        assert "lost its data" in caplog.text
    finally:
        await store.close()


async def test_several_counters_of_a_hash_move_in_one_call(
    redis_server: RedisServer, direct: Any
) -> None:
    """`hincrby_many` on Redis, then while it is away (journalled per field, replayed once it is
    back, added to what another replica counted meanwhile)."""
    proxy = TcpProxy("127.0.0.1", redis_server.port)
    await proxy.start()
    store = RedisStateStore(proxy.url + FAST)
    other = RedisStateStore(redis_server.url + "?timeout_s=5")
    try:
        await store.connect()
        await other.connect()
        assert await store.hincrby_many("wf:stats:m", {"requests": 1, "tokens": 40}) == {
            "requests": 1,
            "tokens": 40,
        }
        assert await store.hincrby_many("wf:stats:m", {"requests": 2}) == {"requests": 3}
        assert await store.hincrby_many("wf:stats:m", {}) == {}
        assert await direct.hgetall("hiveroute:wf:stats:m") == {"requests": "3", "tokens": "40"}
        proxy.set_mode("refuse")  # Redis is gone for this replica
        assert await store.hincrby_many("wf:stats:m", {"requests": 1, "tokens": 2}) == {
            "requests": 4,
            "tokens": 42,
        }
        assert not store.up
        await other.hincrby("wf:stats:m", "requests", 10)  # another replica counts meanwhile
        proxy.set_mode("open")
        await wait_until_up(store)
        assert await direct.hgetall("hiveroute:wf:stats:m") == {"requests": "14", "tokens": "42"}
    finally:
        await store.close()
        await other.close()
        await proxy.stop()


async def test_unreachable_at_start_then_arrives(tmp_path: Any) -> None:
    server = RedisServer(workdir=tmp_path, port=free_port())
    store = RedisStateStore(server.url + FAST)
    try:
        await store.connect()  # nobody listens yet: no exception, local state
        assert not store.up
        assert await store.set_if_absent("wf:home:a", "e1")
        assert await store.hincrby("h", "n", 4) == 4
        server.start()
        await wait_until_up(store)
        check = aioredis.Redis.from_url(server.url, decode_responses=True)
        assert await check.get("hiveroute:wf:home:a") == "e1"
        assert await check.hget("hiveroute:h", "n") == "4"
        await check.aclose()
        assert await store.get("wf:home:a") == "e1"
    finally:
        await store.close()
        server.stop()


async def test_prefix_namespaces_keys(redis_server: RedisServer, direct: Any) -> None:
    a = RedisStateStore(redis_server.url + "?prefix=a:&timeout_s=5")
    b = RedisStateStore(redis_server.url + "?prefix=b:&timeout_s=5")
    try:
        await a.set("k", "1")
        assert await b.get("k") is None
        assert await b.set_if_absent("k", "2")
        assert await direct.get("a:k") == "1" and await direct.get("b:k") == "2"
        assert await a.scan("") == ["k"]
    finally:
        await a.close()
        await b.close()


def test_url_options_are_checked() -> None:
    options = parse_redis_url("redis://:secret@h:7000/2?prefix=p:&timeout_s=0.2&probe_s=3")
    assert (options.prefix, options.timeout_s, options.probe_s) == ("p:", 0.2, 3.0)
    assert "secret" not in options.display and options.display == "redis://h:7000/2"
    assert "prefix" not in options.url and "secret" in options.url
    for bad in (
        "redis://h?timeout_s=0",
        "redis://h?probe_s=x",
        "redis://h?prefix=a%20b",
        "redis:///0",
    ):
        with pytest.raises(ConfigError):
            parse_redis_url(bad)


async def test_concurrent_calls_share_pipelines_and_errors_stay_their_own(
    redis_server: RedisServer,
) -> None:
    store = RedisStateStore(redis_server.url + "?timeout_s=5")
    try:
        await store.set("s", "x")
        results = await asyncio.gather(
            *(store.hincrby("h", "n", 1) for _ in range(50)),
            store.hget("s", "field"),  # a string, not a hash: this call alone fails
            store.get("s"),
            return_exceptions=True,
        )
        assert sorted(results[:50]) == list(range(1, 51))
        assert isinstance(results[50], TypeError) and results[51] == "x"
        assert await store.hget("h", "n") == "50" and store.up
    finally:
        await store.close()


async def test_a_redis_that_refuses_writes_is_down_for_this_replica(
    redis_server: RedisServer, direct: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis that answers but refuses writes (a replica after a failover: READONLY) raised
    its error out of every write, a 500 per request; it is as good as down: the replica serves
    locally, and comes back only once a write succeeds again (a PING would pass at once)."""
    caplog.set_level(logging.INFO, logger="hiveroute.state")
    store = RedisStateStore(redis_server.url + FAST)
    try:
        await store.connect()
        await direct.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # read-only
        assert await store.set_if_absent("wf:home:a", "e1", ttl_s=60)  # served locally
        assert not store.up
        assert await store.hincrby("wf:stats:a", "requests", 1) == 1
        await asyncio.sleep(0.3)  # probes meanwhile: still refused
        assert not store.up and outage_lines(caplog) == (1, 0)
        await direct.execute_command("REPLICAOF", "NO", "ONE")
        await wait_until_up(store)
        assert await direct.get(store.k("wf:home:a")) == "e1"  # the journal merged back
    finally:
        await store.close()
        await direct.execute_command("REPLICAOF", "NO", "ONE")


async def test_a_call_held_over_an_outage_that_has_ended_starts_no_second_one(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A call that hung on a connection when Redis went away can fail after Redis is back.
    Its failure said nothing of Redis now, yet it started a second outage: the replica served
    locally again, and its counters reached the other replicas only after another probe."""
    caplog.set_level(logging.INFO, logger="hiveroute.state")
    store = RedisStateStore(redis_server.url + FAST)
    held, release = asyncio.Event(), asyncio.Event()
    attempts = 0

    async def held_over() -> int:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            held.set()
            await release.wait()
            raise TimeoutError("the reply the outage held back")
        return int(await store.redis.hincrby(store.k("h"), "n", 1))

    async def unanswered() -> None:
        raise TimeoutError("no answer")

    try:
        await store.connect()
        late = asyncio.create_task(store.call(held_over))
        await held.wait()
        with pytest.raises(BackendDown):
            await store.call(unanswered)  # the outage, found by another call
        await wait_until_up(store)
        release.set()
        assert await late == 1  # tried again on Redis, which answered
        assert attempts == 2 and store.up and outage_lines(caplog) == (1, 1)

        attempts = 0
        held.clear(), release.clear()
        late = asyncio.create_task(store.call(held_over))
        await held.wait()
        with pytest.raises(BackendDown):
            await store.call(unanswered)
        release.set()  # fails while Redis is still down: its caller goes local
        with pytest.raises(BackendDown):
            await late
        assert attempts == 1
    finally:
        await store.close()
