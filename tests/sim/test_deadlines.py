"""The deadline board: deferrable work keeps clear of other engines' step ends."""

from __future__ import annotations

import asyncio
import time

import pytest

from hiveroute.sim.deadlines import DeadlineBoard, SizedWorkCost, WorkCost


async def test_work_runs_at_once_when_no_step_end_is_near() -> None:
    board = DeadlineBoard()
    board.sleeping_until(1, time.monotonic() + 1.0)
    await board.gap(0.001, owner=0)
    assert board.waits == 0  # (a count, not a stopwatch: a busy CI machine is slow anyway)


async def test_work_waits_until_a_near_step_end_has_been_served() -> None:
    board = DeadlineBoard()
    board.sleeping_until(1, time.monotonic() + 0.002)
    order: list[str] = []

    async def work() -> None:
        await board.gap(0.005, owner=0)
        order.append("work")

    task = asyncio.create_task(work())
    await asyncio.sleep(0.01)
    assert order == []  # still waiting: engine 1 has not served its step yet
    order.append("served")
    board.served(1)
    await task
    assert order == ["served", "work"]
    assert board.waits == 1


async def test_an_engine_never_waits_for_its_own_step_end() -> None:
    board = DeadlineBoard()
    board.sleeping_until(0, time.monotonic() + 0.001)
    await asyncio.wait_for(board.gap(0.01, owner=0), timeout=2.0)
    assert board.waits == 0


async def test_work_never_waits_past_its_own_deadline() -> None:
    board = DeadlineBoard()
    board.sleeping_until(1, time.monotonic() + 0.001)  # never served: a stuck engine
    started = time.monotonic()
    await board.gap(0.01, owner=0, latest=started + 0.02)
    waited = time.monotonic() - started
    assert board.waits >= 1 and 0.015 <= waited < 2.0  # waited for its deadline, then went


async def test_a_step_end_never_served_holds_work_only_briefly() -> None:
    board = DeadlineBoard()
    board.sleeping_until(1, time.monotonic() - 1.0)  # overdue and never served
    await asyncio.wait_for(board.gap(0.001), timeout=2.0)
    assert board.waits >= 1


def test_next_due_is_the_earliest_other_engines_step_end() -> None:
    board = DeadlineBoard()
    board.sleeping_until(0, 5.0)
    board.sleeping_until(1, 7.0)
    board.sleeping_until(2, 6.0)
    assert board.next_due() == 5.0
    assert board.next_due(exclude=0) == 6.0
    board.served(2)
    assert board.next_due(exclude=0) == 7.0


@pytest.mark.parametrize(
    ("observed", "expected"),
    [([0.002], 0.002), ([0.002, 0.0], 0.002 * 0.95)],
)
def test_a_work_cost_follows_rises_at_once_and_falls_slowly(
    observed: list[float], expected: float
) -> None:
    cost = WorkCost(0.001)
    for seconds in observed:
        cost.observe(seconds)
    assert cost.seconds == pytest.approx(expected)


def test_a_sized_work_cost_scales_with_size_above_its_floor() -> None:
    cost = SizedWorkCost(1e-6, floor=1000)
    cost.observe(0.01, 10_000)  # 1 us per unit
    assert cost.seconds(10_000) == pytest.approx(0.01)
    assert cost.seconds(100) == pytest.approx(0.001)  # small work counts as the floor
    cost.observe(0.0, 10_000)
    assert cost.seconds_per_unit == pytest.approx(1e-6 * 0.95)
