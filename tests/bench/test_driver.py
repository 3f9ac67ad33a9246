"""The driver's measurements against a server whose delays are known."""

from __future__ import annotations

import re

import aiohttp
import pytest

from hiveroute.bench.driver import CellRun, DriverOptions
from hiveroute.bench.workloads.base import BenchRequest, Unit, UnitContext, must
from tests.support.fake_engine import FakeEngine


def unit(unit_id: str, arrival: float, requests: list[BenchRequest], gap: float = 0.0) -> Unit:
    async def program(ctx: UnitContext) -> None:
        parents: list[str] = []
        for i, request in enumerate(requests):
            if i:
                await ctx.sleep(gap)
                request.parents, request.planned_gap_s = parents, gap
            reply = await must(ctx, request)
            parents = [reply.request_id]

    return Unit(unit_id, "workflow", arrival, program, len(requests))


def chat(n: int = 5, **kw: object) -> BenchRequest:
    return BenchRequest(max_tokens=n, messages=[{"role": "user", "content": "a b c"}], **kw)  # type: ignore[arg-type]


async def drive(engine: FakeEngine, units: list[Unit], **options: object) -> CellRun:
    async with aiohttp.ClientSession() as http:
        run = CellRun(
            http,
            [engine.url],
            "fake-model",
            target="t",
            workload="w",
            options=DriverOptions(**options),  # type: ignore[arg-type]
        )
        await run.run(units)
    return run


async def test_ttft_itl_e2e_and_usage_match_the_servers_timings(fake_engine: FakeEngine) -> None:
    fake_engine.behaviour.ttft_s, fake_engine.behaviour.itl_s = 0.2, 0.03
    run = await drive(
        fake_engine, [unit("u", 0, [chat(6, workflow_id="wf", agent_role="planner")])]
    )
    (record,) = run.records
    assert record.ok and record.status == 200
    assert record.ttft_s is not None and record.ttft_s >= 0.2
    # A client may read two chunks in one go, so single gaps have no lower bound; the last
    # token still cannot be seen before the server sent it.
    assert len(record.itl_s) == 5
    assert record.ttft_s + sum(record.itl_s) >= 0.2 + 5 * 0.03
    assert record.e2e_s is not None and record.e2e_s >= 0.2 + 5 * 0.03
    assert record.tpot_s == pytest.approx(sum(record.itl_s) / 5)
    assert record.completion_tokens == 6 and record.cached_tokens == 7
    assert record.prompt_tokens and record.prompt_tokens > 0
    body, headers = fake_engine.received[0], fake_engine.received_headers[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 6 and body["model"] == "fake-model"
    assert headers["X-Workflow-Id"] == "wf" and headers["X-Agent-Role"] == "planner"
    assert run.units[0].duration_s is not None and run.units[0].error is None


async def test_completions_are_measured_too(fake_engine: FakeEngine) -> None:
    run = await drive(fake_engine, [unit("u", 0, [BenchRequest(max_tokens=3, prompt="x y")])])
    (record,) = run.records
    assert record.ok and record.endpoint == "completion" and record.completion_tokens == 3
    assert fake_engine.received[0]["prompt"] == "x y"


async def test_handoff_runs_from_the_parents_last_token_to_the_childs_first(
    fake_engine: FakeEngine,
) -> None:
    fake_engine.behaviour.ttft_s, fake_engine.behaviour.itl_s = 0.1, 0.0
    run = await drive(fake_engine, [unit("u", 0, [chat(2), chat(2)], gap=0.2)])
    first, second = run.records
    assert second.parents == [first.request_id]
    assert second.handoff_s is not None
    assert second.handoff_s >= 0.2 + 0.1  # the tool gap plus the child's own TTFT
    assert second.planned_gap_s == 0.2


async def test_open_loop_never_waits_for_the_target(fake_engine: FakeEngine) -> None:
    fake_engine.behaviour.ttft_s = 1.0
    run = await drive(fake_engine, [unit(f"u{i}", 0.01 * i, [chat(1)]) for i in range(6)])
    assert len(run.records) == 6
    first_answer = min(r.t_send_s + (r.ttft_s or 0) for r in run.records)
    assert max(r.t_send_s for r in run.records) < first_answer


async def test_closed_loop_keeps_the_concurrency(fake_engine: FakeEngine) -> None:
    fake_engine.behaviour.ttft_s = 0.05
    run = await drive(
        fake_engine, [unit(f"u{i}", 0, [chat(1)]) for i in range(6)], mode="closed", concurrency=2
    )
    assert len(run.records) == 6 and all(r.ok for r in run.records)
    assert fake_engine.most_in_flight == 2


async def test_errors_are_recorded_and_stop_the_unit(fake_engine: FakeEngine) -> None:
    fake_engine.behaviour.status = 503
    fake_engine.behaviour.error_body = {"error": {"message": "engine says no", "type": "x"}}
    run = await drive(fake_engine, [unit("u", 0, [chat(), chat()])])
    (record,) = run.records  # the second step never ran
    assert record.error == "HTTP 503: engine says no" and record.status == 503
    assert run.units[0].error and run.errors == 1


async def test_unreachable_target_is_an_error_not_a_crash() -> None:
    async with aiohttp.ClientSession() as http:
        run = CellRun(
            http, ["http://127.0.0.1:9"], "m", target="t", workload="w", options=DriverOptions()
        )
        await run.run([unit("u", 0, [chat()])])
    assert run.records[0].error and "Client" in run.records[0].error


async def test_requests_go_to_each_replica_in_turn(fake_engine: FakeEngine) -> None:
    """Two URLs, one of them dead: every other request fails, whichever unit sends it."""
    fake_engine.behaviour.ttft_s = 0.0
    async with aiohttp.ClientSession() as http:
        run = CellRun(
            http,
            [fake_engine.url, "http://127.0.0.1:9"],
            "fake-model",
            target="t",
            workload="w",
            options=DriverOptions(mode="closed", concurrency=1),
        )
        await run.run([unit(f"u{i}", 0, [chat(1)]) for i in range(4)])
    assert [r.ok for r in run.records] == [True, False, True, False]
    dead = "http://127.0.0.1:9"
    assert [r.sent_to for r in run.records] == [fake_engine.url, dead, fake_engine.url, dead]
    assert len(fake_engine.received) == 2
    with pytest.raises(ValueError, match="at least one URL"):
        CellRun(http, [], "m", target="t", workload="w", options=DriverOptions())


async def test_request_budget_bounds_the_count(fake_engine: FakeEngine) -> None:
    fake_engine.behaviour.ttft_s = 0.0
    run = await drive(
        fake_engine, [unit(f"u{i}", 0, [chat(1), chat(1)]) for i in range(4)], max_requests=3
    )
    assert len(run.records) == 3
    assert any(u.cut for u in run.units)


async def test_deadline_bounds_the_time(fake_engine: FakeEngine) -> None:
    fake_engine.behaviour.ttft_s = 0.0
    units = [unit("early", 0, [chat(1), chat(1)], gap=5.0), unit("late", 3.0, [chat(1)])]
    run = await drive(fake_engine, units, duration_s=0.3, grace_s=0.5)
    assert [r.unit_id for r in run.records] == ["early"]  # late never arrived, early cut
    assert run.units[0].cut and len(run.units) == 1


async def test_requests_still_running_at_the_end_are_cancelled_as_cut(
    fake_engine: FakeEngine,
) -> None:
    fake_engine.behaviour.ttft_s = 10.0
    run = await drive(fake_engine, [unit("u", 0, [chat(1)])], duration_s=0.1, grace_s=0.2)
    (record,) = run.records
    assert record.cut and record.error and not run.errors


async def test_context_refs_reach_the_engine_as_the_registered_context_first(
    fake_engine: FakeEngine, tmp_path: object
) -> None:
    from pathlib import Path

    from hiveroute.bench.engines import Fleet
    from hiveroute.bench.targets import TargetSpec, start_target
    from hiveroute.bench.workloads.agentic import AgenticConfig, AgenticWorkload
    from hiveroute.bench.workloads.base import GapDistribution

    config = AgenticConfig(
        workflows=1,
        fan_out=1,
        rounds=1,
        kb_tokens=40,
        task_tokens=8,
        role_tokens=6,
        tool_gap=GapDistribution("const", 0.0),
        layout="role_first",
        namespace="runq",
        context_refs=True,
    )
    (unit_,) = list(AgenticWorkload(config).units())
    fleet = Fleet(specs=[fake_engine.url], urls=[fake_engine.url], kind="fake")
    target = await start_target(
        TargetSpec.parse("hiveroute-inproc:round_robin"), fleet, Path(str(tmp_path))
    )
    try:
        async with aiohttp.ClientSession() as http:
            run = CellRun(
                http, target.urls, "fake-model", target="t", workload="w", options=DriverOptions()
            )
            await run.run([unit_])
            async with http.get(f"{target.url}/v1/workflows/{unit_.unit_id}") as response:
                state = (await response.json())["state"]
    finally:
        await target.stop()
    assert [r.ok for r in run.records] == [True] * 4 and not run.units[0].error
    prewarm, *requests = fake_engine.received  # registering the context pre-warms it
    assert prewarm["max_tokens"] == 1 and prewarm["messages"][0]["content"].startswith("runq\n")
    assert len(requests) == 4
    for body in requests:
        assert "hiveroute" not in body  # the router expanded the reference
        system = body["messages"][0]["content"]
        role = re.search(r"role(planner|executor|validator)", system)
        assert system.startswith("runq\ntask0x0") and role and role.start() > 40
    assert state == "ended"  # the workflow was ended when done
