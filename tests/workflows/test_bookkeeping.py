"""A request's workflow bookkeeping is written while it runs, not before it is routed: routing
reads none of it, and a slow state store (a remote Redis) must not add its round trips to every
request's time to first token. Its end is recorded after its start, whatever the order in
which the store answers."""

import asyncio
import time

from hiveroute.routing.base import RequestOutcome
from hiveroute.state.memory import MemoryStateStore
from tests.workflows.test_placement import make_router, request


class StallingStore(MemoryStateStore):
    """A memory store whose hash writes wait until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def hset(self, key: str, mapping: dict[str, str]) -> None:
        await self.release.wait()
        await super().hset(key, mapping)


async def test_a_stalled_store_does_not_hold_the_request_and_its_end_follows_its_start() -> None:
    router, service = make_router(n=2)
    store = StallingStore()
    store.release.set()
    service.registry.store = store
    engines = []
    for rid, agent in (("r1", "planner"), ("r2", "executor")):
        req = request("w", agent, rid)
        if rid == "r2":  # the workflow exists; now every hash write stalls
            store.release.clear()
        await asyncio.wait_for(service.before_route(req), timeout=30)  # not held by the store
        decision, _ = await router.policy.route(req, router.pool.candidates(None))
        engines.append(decision.engine.name)
        service.after_complete(req, RequestOutcome(decision.engine, 200, prompt_tokens=10))
        await asyncio.sleep(0)
    assert list(await store.hgetall("wf:req:w")) == ["r1"]  # r2's start is not written yet
    store.release.set()
    await service.flush()
    described = await service.registry.describe("w")
    records = described["requests"]
    assert [r["request_id"] for r in records] == ["r1", "r2"]
    assert all(r["ended_at"] is not None and r["status"] == "ok" for r in records)
    assert [r["engine"] for r in records] == engines
    assert described["totals"]["requests"] == 2


class RoundCountingStore(MemoryStateStore):
    """A store across a network: calls issued together travel in one round trip. Every call
    waits for the next round; a round leaves once no new call joined it for a few loop turns."""

    in_process = False
    METHODS = ("get", "set", "expire", "hget", "hgetall", "hset", "hdel", "hincrby",
               "hincrby_many", "hincrbyfloat", "push_bounded", "lrange", "set_if_absent")  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self.rounds = 0
        self._waiting: list[asyncio.Future[None]] = []
        for name in self.METHODS:
            setattr(self, name, self._remote(getattr(self, name)))

    def _remote(self, call):  # type: ignore[no-untyped-def]
        async def remote(*args, **kwargs):  # type: ignore[no-untyped-def]
            future = asyncio.get_running_loop().create_future()
            self._waiting.append(future)
            if len(self._waiting) == 1:
                asyncio.get_running_loop().create_task(self._send_round())
            await future
            return await call(*args, **kwargs)

        return remote

    async def _send_round(self) -> None:
        for _ in range(5):  # calls gathered together all join within a few turns
            await asyncio.sleep(0)
        self.rounds += 1
        waiting, self._waiting = self._waiting, []
        for future in waiting:
            future.set_result(None)


async def test_a_request_is_recorded_in_two_round_trips_at_its_start_and_two_at_its_end() -> None:
    router, service = make_router(n=2)
    store = RoundCountingStore()
    service.registry.store = store
    req = request("w", "planner", "r1")
    await service.before_route(req)
    decision, _ = await router.policy.route(req, router.pool.candidates(None))
    await service.flush()  # its start is written
    store.rounds = 0
    outcome = RequestOutcome(decision.engine, 200, prompt_tokens=10, cached_tokens=4)
    service.after_complete(req, outcome)
    await service.flush()
    assert store.rounds == 2  # 18 when each call waited for the one before
    stats = await store.hgetall("wf:stats:w")
    assert stats["requests"] == "1" and stats["requests|planner"] == "1"
    assert stats["cached_tokens"] == "4" and stats["last_ended_at"]
    store.rounds = 0
    again = request("w", "planner", "r2")  # an agent the workflow knows: its start only
    await service.before_route(again)
    await service.flush()
    assert store.rounds == 2  # 3 when the hand-off was read before the writes went out
    assert set(await store.hgetall("wf:req:w")) == {"r1", "r2"}


async def test_two_requests_that_share_an_x_request_id_are_two_requests_in_flight() -> None:
    """A proxy's retry or hedge keeps the client's X-Request-Id. The first of two such
    requests to end took the second's place in the bookkeeping: the workflow looked idle
    (keep-warm's cue) while the second still ran."""
    router, service = make_router(n=2)
    first, second = request("w", "planner", "same-id"), request("w", "executor", "same-id")
    for req in (first, second):
        await service.before_route(req)
    view = service.registry.cached_view("w")
    assert view is not None and view.busy(time.monotonic(), 60.0)
    engine = router.pool.engines[0]
    service.after_complete(first, RequestOutcome(engine, 200, prompt_tokens=10))
    assert view.busy(time.monotonic(), 60.0)  # the second is still running
    service.after_complete(second, RequestOutcome(engine, 200, prompt_tokens=10))
    assert not view.busy(time.monotonic(), 60.0)
    await service.flush()
