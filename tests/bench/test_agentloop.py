"""The agentloop workload: Responses chains and Messages histories, generated and driven."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from typing import Any

import aiohttp
from multidict import CIMultiDict

from hiveroute.bench.driver import CellRun, DriverOptions
from hiveroute.bench.workloads.agentloop import AgentLoopConfig, AgentLoopWorkload
from hiveroute.bench.workloads.base import BenchRequest, GapDistribution, Reply
from hiveroute.metadata import extract_metadata
from hiveroute.sim import SimConfig, SimFleet


class ChainContext:
    """Records what a unit sends; answers with a fresh response id each time."""

    def __init__(self) -> None:
        self.sent: list[BenchRequest] = []
        self.slept: list[float] = []

    async def send(self, request: BenchRequest) -> Reply:
        self.sent.append(request)
        await asyncio.sleep(0)
        n = len(self.sent)
        return Reply(f"r{n}", f"answer {n}", True, response_id=f"resp_{n}")

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def _workload(**overrides: Any) -> AgentLoopWorkload:
    options: dict[str, Any] = {
        "agents": 2,
        "steps": 3,
        "rate": 0,
        "system_tokens": 64,
        "task_tokens": 16,
        "result_tokens": 8,
        "answer_tokens": 4,
        "tool_time": GapDistribution("const", 0.25),
    }
    options.update(overrides)
    return AgentLoopWorkload(AgentLoopConfig(**options))


async def test_responses_agents_chain_previous_response_ids() -> None:
    unit = next(iter(_workload(api="responses").units()))
    ctx = ChainContext()
    await unit.run(ctx)
    first, *rest = ctx.sent
    assert first.api == "responses" and first.previous_response_id is None
    assert isinstance(first.input_items, str) and first.instructions
    for i, request in enumerate(rest):
        assert request.previous_response_id == f"resp_{i + 1}"
        assert request.instructions == first.instructions  # not carried over by the API
        (item,) = request.input_items or []
        assert item["type"] == "function_call_output" and item["output"]
        assert request.parents == [f"r{i + 1}"] and request.planned_gap_s == 0.25
    assert ctx.slept == [0.25, 0.25]
    assert {r.session_id for r in ctx.sent} == {unit.unit_id}


async def test_messages_agents_resend_a_growing_history_with_tool_blocks() -> None:
    units = list(_workload(api="both").units())
    assert [u.kind for u in units] == ["agent-responses", "agent-messages"]
    ctx = ChainContext()
    await units[1].run(ctx)
    histories = [r.messages or [] for r in ctx.sent]
    assert [len(h) for h in histories] == [1, 3, 5]
    for shorter, longer in itertools.pairwise(histories):
        assert longer[: len(shorter)] == shorter  # each prompt extends the previous one
    assistant, user = histories[2][1], histories[2][2]
    tool_use = assistant["content"][1]
    assert assistant["content"][0] == {"type": "text", "text": "answer 1"}
    assert tool_use["type"] == "tool_use"
    assert user["content"][0]["tool_use_id"] == tool_use["id"]
    assert all(r.api == "messages" and r.system for r in ctx.sent)


async def test_agentloop_runs_against_the_simulator_with_cache_hits() -> None:
    fleet = SimFleet(
        SimConfig(engines=1, base_port=0, events_base_port=0, preset="fast", kv_events=False)
    )
    await fleet.start()
    workload = _workload(
        agents=4, steps=3, system_tokens=256, tool_time=GapDistribution("const", 0)
    )
    async with aiohttp.ClientSession() as http:
        run = CellRun(
            http,
            [fleet.engines[0].url],
            "sim-model",
            target="engine",
            workload="agentloop",
            options=DriverOptions(duration_s=60),
        )
        try:
            await run.run(workload.units())
        finally:
            await fleet.stop()
    assert len(run.records) == 12 and all(r.ok for r in run.records), [r.error for r in run.records]
    assert {r.endpoint for r in run.records} == {"responses", "messages"}
    by_unit: dict[str, list[Any]] = defaultdict(list)
    for record in run.records:
        by_unit[record.unit_id].append(record)
    for records in by_unit.values():
        records.sort(key=lambda r: r.t_send_s)
        prompts = [r.prompt_tokens for r in records]
        assert prompts == sorted(prompts) and prompts[0] < prompts[-1]
        for previous, record in itertools.pairwise(records):
            # the previous step's prompt is cached: all its full blocks hit
            assert record.cached_tokens >= (previous.prompt_tokens // 16 - 1) * 16
        assert all(r.ttft_s is not None and r.completion_tokens == 4 for r in records)


async def test_subagents_fork_the_parents_context_with_native_identity() -> None:
    responses_unit, messages_unit = list(_workload(api="both", subagents=2).units())
    assert responses_unit.planned_requests == 3 + 2 * 2
    ctx = ChainContext()
    await responses_unit.run(ctx)
    main = responses_unit.unit_id
    subs = [r for r in ctx.sent if r.agent_id != main]
    assert len(subs) == 4 and len(ctx.sent) == 7
    firsts = [r for r in subs if r.stage == "step1"]
    assert {r.previous_response_id for r in firsts} == {"resp_1"}  # both fork step 1's answer
    for request in subs:
        headers = request.headers()
        assert headers["session-id"] == main and headers["thread-id"] == request.agent_id
        assert headers["x-codex-parent-thread-id"] == main
        meta, _ = extract_metadata({}, CIMultiDict(headers))
        assert (meta.session_id, meta.agent_id, meta.parent_agent_id) == (
            main,
            request.agent_id,
            main,
        )
    after = [r for r in ctx.sent if r.agent_id == main][1]
    assert [i["call_id"] for i in after.input_items or []] == [
        f"call_{main}-sub0",
        f"call_{main}-sub1",
    ]
    assert ctx.sent[0].headers() == {"session-id": main, "thread-id": main}

    ctx = ChainContext()
    await messages_unit.run(ctx)
    main = messages_unit.unit_id
    parent_first = ctx.sent[0].messages or []
    sub_firsts = [r for r in ctx.sent if r.agent_id != main and r.stage == "step1"]
    assert len(sub_firsts) == 2
    for request in sub_firsts:
        history = request.messages or []
        assert history[: len(parent_first)] == parent_first  # the parent's context, then its own
        assert history[-1]["content"].startswith("subtask")
        assert request.headers() == {
            "x-claude-code-session-id": main,
            "x-claude-code-agent-id": request.agent_id,
        }
    assert ctx.sent[0].headers() == {"x-claude-code-session-id": main}
    hiveroute_ids = _workload(api="messages", identity="hiveroute")
    ctx = ChainContext()
    await next(iter(hiveroute_ids.units())).run(ctx)
    assert ctx.sent[0].headers()["X-Session-Id"] == ctx.sent[0].session_id


async def test_subagents_against_the_simulator_all_succeed() -> None:
    fleet = SimFleet(
        SimConfig(engines=1, base_port=0, events_base_port=0, preset="fast", kv_events=False)
    )
    await fleet.start()
    workload = _workload(agents=2, steps=2, subagents=3, tool_time=GapDistribution("const", 0))
    async with aiohttp.ClientSession() as http:
        run = CellRun(
            http,
            [fleet.engines[0].url],
            "sim-model",
            target="engine",
            workload="agentloop",
            options=DriverOptions(duration_s=60),
        )
        try:
            await run.run(workload.units())
        finally:
            await fleet.stop()
    assert len(run.records) == 2 * (2 + 3 * 2)
    assert all(r.ok for r in run.records), [r.error for r in run.records]
    forks = [r for r in run.records if r.stage == "step1" and r.agent_role == "subagent"]
    # a subagent starts from its parent's context: most of its first prompt is cached
    assert len(forks) == 6 and all(r.cached_tokens > r.prompt_tokens // 2 for r in forks)
