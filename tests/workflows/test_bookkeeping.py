"""A request's workflow bookkeeping is written while it runs, not before it is routed: routing
reads none of it, and a slow state store (a remote Redis) must not add its round trips to every
request's time to first token. Its end is recorded after its start, whatever the order in
which the store answers."""

import asyncio
import time

from hiveroute.routing.base import RequestOutcome
from hiveroute.state.memory import MemoryStateStore
from tests.support.stores import RoundCountingStore, StalledStore
from tests.workflows.test_placement import make_router, request, route


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


async def test_a_new_workflows_first_request_waits_for_one_round_trip() -> None:
    """Its creation and the read of what the store has (another replica may have created it)
    travel together; its home is claimed after the request is routed. It waited for three
    rounds in turn (ten before that), each a wait for another process: the parent under
    `serve --workers`, Redis across replicas."""
    router, service = make_router(n=2)
    store = RoundCountingStore(rounds_allowed=1)
    service.registry.store = store
    req = request("w", "planner", "r1")
    await asyncio.wait_for(service.before_route(req), timeout=30)
    decision, _ = await asyncio.wait_for(
        router.policy.route(req, router.pool.candidates(None)), timeout=30
    )
    view = service.registry.cached_view("w")
    assert view is not None and view.home == decision.engine.name
    assert await MemoryStateStore.get(store, "wf:home:w") is None  # the claim waits
    store.release.set()
    await service.flush()
    assert await store.get("wf:home:w") == decision.engine.name
    assert await store.get("wf:doc:w") is not None


async def test_a_home_claimed_first_by_another_replica_wins_after_the_request() -> None:
    """The request routes on this replica's choice; the store's winner then becomes the
    view's home, so the workflow's next requests go where every replica sends them."""
    router, service = make_router(n=2)
    store = RoundCountingStore(rounds_allowed=1)
    service.registry.store = store
    req = request("w", "planner", "r1")
    await asyncio.wait_for(service.before_route(req), timeout=30)
    decision, _ = await asyncio.wait_for(
        router.policy.route(req, router.pool.candidates(None)), timeout=30
    )
    other = next(e.name for e in router.pool.engines if e.name != decision.engine.name)
    await MemoryStateStore.set(store, "wf:home:w", other)  # another replica's claim came first
    store.release.set()
    await service.flush()
    view = service.registry.cached_view("w")
    assert view is not None and view.home == other


async def test_a_known_workflows_old_view_is_refreshed_after_its_request_is_routed() -> None:
    """Past `view_ttl_s` the view was read again in the request's path: four round trips in
    turn, 15 ms for one request in ten on a busy two-core host. The request now routes on the
    view it has, and the store's news (here another replica's move of the home) reaches the
    view in the background."""
    router, service = make_router(n=2)
    store = StalledStore()
    service.registry.store = store
    now = [1000.0]
    service.registry.clock = lambda: now[0]
    first = request("w", "planner", "r1")
    home, _ = await route(router, first)
    await service.flush()
    other = next(e.name for e in router.pool.engines if e.name != home)
    await MemoryStateStore.set(store, "wf:home:w", other)  # another replica moved it
    now[0] += service.registry.limits.view_ttl_s + 1
    store.release.clear()
    second = request("w", "executor", "r2")
    await asyncio.wait_for(route(router, second), timeout=30)  # not held by the store
    view = service.registry.cached_view("w")
    assert view is not None and view.home == home  # routed on the view it had
    store.release.set()
    await service.flush()
    assert view.home == other and view.fetched_at == now[0]
