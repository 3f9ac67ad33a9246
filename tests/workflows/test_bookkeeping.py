"""A request's workflow bookkeeping is written while it runs, not before it is routed: routing
reads none of it, and a slow state store (a remote Redis) must not add its round trips to every
request's time to first token. Its end is recorded after its start, whatever the order in
which the store answers."""

import asyncio

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
