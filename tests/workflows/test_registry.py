import pytest

from hiveroute.errors import BadRequest, Conflict, NotFound
from hiveroute.state import MemoryStateStore
from hiveroute.workflows.registry import RegistryLimits, WorkflowRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def make(**limits: object) -> tuple[WorkflowRegistry, Clock]:
    clock = Clock()
    return WorkflowRegistry(MemoryStateStore(), RegistryLimits(**limits), clock=clock), clock  # type: ignore[arg-type]


async def run_request(
    reg: WorkflowRegistry,
    clock: Clock,
    wid: str,
    rid: str,
    agent: str,
    *,
    ttft: float,
    duration: float,
    parent: str | None = None,
    prompt: int = 100,
    cached: int = 0,
    cross: int = 0,
    parent_agent: str | None = None,
) -> None:
    view = await reg.ensure(wid)
    record = reg.new_record(
        view,
        request_id=rid,
        agent_id=agent,
        agent_role=agent.split("-")[0],
        stage="s1",
        parent_request_id=parent,
        parent_agent_id=parent_agent,
    )
    await reg.record_start(view, record)
    clock.now += duration
    await reg.finish_request(
        wid,
        record,
        engine="e1",
        status="ok",
        ttft_s=ttft,
        duration_s=duration,
        prompt_tokens=prompt,
        cached_tokens=cached,
        cross_agent_cached_tokens=cross,
        completion_tokens=5,
    )


async def test_lifecycle_created_on_first_request_expires_revives_ends() -> None:
    reg, clock = make(ttl_s=10.0)
    await run_request(reg, clock, "w", "r1", "planner", ttft=0.5, duration=1.0)
    assert (await reg.describe("w"))["state"] == "active"
    clock.now += 11
    assert await reg.sweep() == ["w"]
    assert (await reg.describe("w"))["state"] == "expired"
    await run_request(reg, clock, "w", "r2", "planner", ttft=0.5, duration=1.0)  # revives
    assert (await reg.describe("w"))["state"] == "active"
    assert await reg.end("w") == {"id": "w", "state": "ended"}
    with pytest.raises(Conflict):
        await reg.ensure("w")
    with pytest.raises(NotFound):
        await reg.end("nope")


async def test_two_declarations_of_one_id_at_once_are_one_201_and_one_409() -> None:
    """Both found the id free; the second's create lost. It was a 201 too, its settings
    silently dropped and its agents merged into the first's workflow."""
    import asyncio

    class Store(MemoryStateStore):  # a shared store answers later: the two interleave
        async def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> bool:
            await asyncio.sleep(0)
            return await super().set_if_absent(key, value, ttl_s=ttl_s)

    reg = WorkflowRegistry(Store(), RegistryLimits(), clock=Clock())
    first = {"id": "w", "ttl_s": 60, "agents": [{"id": "a", "role": "planner"}]}
    second = {"id": "w", "ttl_s": 600, "agents": [{"id": "b", "role": "critic"}]}
    results = await asyncio.gather(reg.declare(first), reg.declare(second), return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["Conflict", "WorkflowSettings"]
    view = await reg.view("w", fresh=True)
    assert view is not None and view.settings.ttl_s == 60
    assert {a["id"] for a in view.settings.declared_agents} == {"a"}


async def test_declare_validates_and_conflicts() -> None:
    reg, _ = make()
    settings = await reg.declare({"id": "w", "agents": [{"id": "a", "role": "planner"}]})
    assert settings.declared
    with pytest.raises(Conflict):
        await reg.declare({"id": "w"})
    for bad in (
        {"ttl_s": -1},
        {"ttl_s": "x"},
        {"agents": [{"name": "x"}]},
        {"expected_fanout": 0},
        {"shared_prefix_layout": "yes"},
        {"bogus": 1},
        {"id": "has space"},
        {"context_ids": "c1"},
    ):
        with pytest.raises(BadRequest):
            await reg.declare(bad)
    generated = await reg.declare({})
    assert generated.id.startswith("wf-")
    described = await reg.describe("w")
    assert described["agents"][0]["id"] == "a" and described["agents"][0]["role"] == "planner"


async def test_handoffs_ttft_and_completion_time() -> None:
    reg, clock = make()
    t0 = clock.now
    await run_request(reg, clock, "w", "p1", "planner", ttft=0.25, duration=1.0, prompt=100)
    clock.now += 0.5  # hand-off gap
    await run_request(
        reg,
        clock,
        "w",
        "x1",
        "executor-0",
        ttft=0.1,
        duration=2.0,
        parent="p1",
        prompt=120,
        cached=100,
        cross=96,
    )
    clock.now += 0.25
    # no parent: the latest finished request of another agent (x1) is the source
    await run_request(reg, clock, "w", "v1", "validator", ttft=0.1, duration=1.0, prompt=50)
    # the executor again after a tool call, parent = its own request: not a hand-off
    await run_request(
        reg, clock, "w", "x2", "executor-0", ttft=0.1, duration=1.0, parent="x1", prompt=10
    )
    d = await reg.describe("w")
    assert [(h["from_agent"], h["to_agent"]) for h in d["handoffs"]] == [
        ("planner", "executor-0"),
        ("executor-0", "validator"),
    ]
    assert d["handoffs"][0]["latency_s"] == pytest.approx(0.5)
    assert d["handoffs"][1]["latency_s"] == pytest.approx(0.25)
    totals = d["totals"]
    assert totals["requests"] == 4
    assert totals["prompt_tokens"] == 280 and totals["cached_tokens"] == 100
    assert totals["cross_agent_cached_tokens"] == 96
    assert totals["cross_agent_hit_rate"] == pytest.approx(96 / 280, abs=1e-6)
    assert totals["workflow_ttft_s"] == pytest.approx(0.25)
    assert totals["completion_time_s"] == pytest.approx(clock.now - t0)
    assert [r["request_id"] for r in d["requests"]] == ["p1", "x1", "v1", "x2"]
    first = d["requests"][0]
    assert first["first_token_at"] == pytest.approx(t0 + 0.25)
    assert first["status"] == "ok" and first["engine"] == "e1"
    agents = {a["id"]: a for a in d["agents"]}
    assert agents["executor-0"]["requests"] == 2
    assert agents["executor-0"]["cross_agent_cached_tokens"] == 96
    assert d["engines"] == {"e1": 4}


async def test_requests_and_agents_are_bounded() -> None:
    reg, clock = make(max_requests=3, max_agents=2)
    for i in range(5):
        await run_request(reg, clock, "w", f"r{i}", f"agent-{i}", ttft=0.1, duration=0.1)
    d = await reg.describe("w")
    assert [r["request_id"] for r in d["requests"]] == ["r2", "r3", "r4"]
    assert d["totals"]["requests"] == 5
    assert {a["id"] for a in d["agents"]} == {"agent-0", "agent-1", "(other)"}


async def test_home_is_agreed_once() -> None:
    store = MemoryStateStore()
    a = WorkflowRegistry(store)
    b = WorkflowRegistry(store)  # a second replica
    va, vb = await a.ensure("w"), await b.ensure("w")
    assert await a.claim_home(va, "e1") == "e1"
    assert await b.claim_home(vb, "e2") == "e1"
    assert await b.replace_home(vb, "e1", "e3") == "e3"
    assert await a.replace_home(va, "e1", "e4") == "e3"  # lost the race: reads the winner


async def test_a_subagents_handoff_is_from_its_parent_agent() -> None:
    reg, clock = make()
    await run_request(reg, clock, "w", "l1", "lead", ttft=0.1, duration=1.0)
    await run_request(reg, clock, "w", "o1", "other", ttft=0.1, duration=1.0)
    clock.now += 0.75
    # the latest other agent to end is `other`; the subagent's parent is `lead`
    await run_request(reg, clock, "w", "s1", "sub-0", ttft=0.1, duration=1.0, parent_agent="lead")
    handoffs = (await reg.describe("w"))["handoffs"]
    assert (handoffs[-1]["from_agent"], handoffs[-1]["to_agent"]) == ("lead", "sub-0")
    assert handoffs[-1]["from_request_id"] == "l1"
    assert handoffs[-1]["latency_s"] == pytest.approx(1.75)


class ExpireCountingStore(MemoryStateStore):
    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.expires: list[str] = []

    async def expire(self, key: str, ttl_s: float | None) -> bool:
        self.expires.append(key)
        return await super().expire(key, ttl_s)


async def test_keys_are_renewed_once_per_tenth_of_their_ttl_and_outlive_the_last_request() -> None:
    clock = Clock()
    store = ExpireCountingStore(clock)
    reg = WorkflowRegistry(store, RegistryLimits(ttl_s=100.0, retain_s=900.0), clock=clock)
    await run_request(reg, clock, "w", "r0", "planner", ttft=0.1, duration=1.0)
    renewed = set(store.expires)
    assert {"wf:req:w", "wf:order:w", "wf:stats:w", "wf:doc:w", "wf:last:w"} <= renewed
    store.expires.clear()
    for i in range(1, 20):  # 19 more requests within a tenth of the keys' TTL (1,000 s)
        await run_request(reg, clock, "w", f"r{i}", "planner", ttft=0.1, duration=4.0)
    assert store.expires == []  # a renewal on every request was 8 calls each
    last_request = clock.now
    clock.now = last_request + 999.0  # the workflow's keys outlive its last request by the TTL
    assert await store.hgetall("wf:req:w")
    clock.now = last_request + 200.0
    await run_request(reg, clock, "w", "late", "planner", ttft=0.1, duration=1.0)
    assert "wf:req:w" in store.expires  # due again: renewed


async def test_a_workflow_recreated_by_another_replica_has_its_new_keys_renewed() -> None:
    clock = Clock()
    store = ExpireCountingStore(clock)
    a = WorkflowRegistry(store, RegistryLimits(ttl_s=100.0), clock=clock)
    b = WorkflowRegistry(store, RegistryLimits(ttl_s=100.0), clock=clock)
    await run_request(a, clock, "w", "r1", "planner", ttft=0.1, duration=1.0)
    await b.end("w")
    await b.declare({"id": "w"})  # purged and created again: its keys are new
    clock.now += 2.0  # past the views' refresh
    store.expires.clear()
    await run_request(a, clock, "w", "r2", "planner", ttft=0.1, duration=1.0)
    assert "wf:req:w" in store.expires


async def test_a_workflow_ended_by_another_replica_is_told_to_the_listeners_here() -> None:
    """Replica A knew the workflow active; B ended it. A's next read of it found it ended and
    said nothing: no longer active, it was never swept again, and A's keep-warm kept its pins
    and the accountant its figures for good."""
    store = MemoryStateStore()
    a = WorkflowRegistry(store, RegistryLimits(), clock=Clock())
    b = WorkflowRegistry(store, RegistryLimits(), clock=Clock())
    heard: list[tuple[str, str]] = []
    a.on_state_change(lambda workflow, state: heard.append((workflow, state)))
    await a.ensure("w")
    await b.end("w")
    assert heard == []
    await a.view("w", fresh=True)
    assert heard == [("w", "ended")]
    await a.view("w", fresh=True)
    assert heard == [("w", "ended")]  # once


async def test_workers_sharing_a_store_count_its_active_workflows_alike() -> None:
    """Each worker (or replica) holds views of the workflows it served only: summing the
    counts of its views counted a workflow served by two workers twice. Each counts the
    store's instead: the same number, what the metrics' merge now takes once."""
    store = MemoryStateStore()
    clock = Clock()
    one, two = (WorkflowRegistry(store, RegistryLimits(ttl_s=60.0), clock=clock) for _ in range(2))
    await one.ensure("both")  # served by both workers
    await two.ensure("both")
    await one.ensure("first")
    await two.ensure("second")
    await one.ensure("ended")
    await one.end("ended")
    assert len(one.active_views()) + len(two.active_views()) == 4  # what the sum said
    assert await one.count_active() == await two.count_active() == 3
    clock.now += 30.0
    await two.ensure("second")  # active again: its stats say so to every worker
    await two.record_start(
        two.cached_view("second"),  # type: ignore[arg-type]
        two.new_record(
            two.cached_view("second"),  # type: ignore[arg-type]
            request_id="r1",
            agent_id=None,
            agent_role=None,
            stage=None,
            parent_request_id=None,
            parent_agent_id=None,
        ),
    )
    clock.now += 40.0  # "both" and "first" idle past their TTL, "second" not
    assert await one.count_active(batch=1) == 1
