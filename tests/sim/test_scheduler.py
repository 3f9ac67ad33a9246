"""The scheduler batches, chunks, admits and preempts as vLLM v1's does."""

from __future__ import annotations

from hiveroute.sim.kv_cache import BlockPool, KVCacheManager
from hiveroute.sim.scheduler import PREEMPTED, RUNNING, Scheduler, SimRequest


def _scheduler(
    *, blocks: int = 64, block_size: int = 4, budget: int = 64, seqs: int = 8, policy: str = "fcfs"
) -> Scheduler:
    return Scheduler(
        KVCacheManager(BlockPool(blocks, block_size)),
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        max_model_len=4096,
        policy=policy,
    )


def _request(
    name: str, n: int, *, max_tokens: int = 8, priority: int = 0, arrival: float = 0.0
) -> SimRequest:
    base = sum(map(ord, name)) * 1000
    return SimRequest(
        name, list(range(base, base + n)), max_tokens=max_tokens, priority=priority, arrival=arrival
    )


def _finish_step(scheduler: Scheduler) -> None:
    """What the engine does after a step: requests that computed everything get a token."""
    for request in list(scheduler.running):
        if request.num_computed_tokens >= len(request.token_ids):
            request.token_ids.append(7)


def test_chunked_prefill_splits_a_long_prompt_over_the_token_budget() -> None:
    scheduler = _scheduler(budget=16)
    request = _request("a", 40)
    scheduler.add(request)
    chunks = []
    for _ in range(3):
        plan = scheduler.schedule()
        chunks.append([n for _, n in plan.scheduled])
        _finish_step(scheduler)
    assert chunks == [[16], [16], [8]]
    assert request.num_output_tokens == 1  # the token comes after the last chunk only


def test_decodes_and_a_new_prefill_share_one_step() -> None:
    scheduler = _scheduler(budget=16)
    first = _request("a", 5)
    scheduler.add(first)
    scheduler.schedule()
    _finish_step(scheduler)
    scheduler.add(_request("b", 30))
    plan = scheduler.schedule()
    assert [(r.request_id, n) for r, n in plan.scheduled] == [("a", 1), ("b", 15)]
    assert plan.decode_seqs == 1 and plan.prefill_tokens == 15


def test_max_num_seqs_caps_the_running_batch() -> None:
    scheduler = _scheduler(seqs=2)
    for name in "abc":
        scheduler.add(_request(name, 4))
    plan = scheduler.schedule()
    assert [r.request_id for r, _ in plan.scheduled] == ["a", "b"]
    assert len(scheduler.waiting) == 1


def test_priority_policy_admits_lowest_priority_value_first() -> None:
    scheduler = _scheduler(seqs=1, policy="priority")
    scheduler.add(_request("late-important", 4, priority=-5, arrival=2.0))
    scheduler.add(_request("early", 4, priority=0, arrival=1.0))
    plan = scheduler.schedule()
    assert [r.request_id for r, _ in plan.scheduled] == ["late-important"]


def test_fcfs_keeps_arrival_order() -> None:
    scheduler = _scheduler(seqs=1)
    scheduler.add(_request("first", 4))
    scheduler.add(_request("second", 4, priority=-5))
    plan = scheduler.schedule()
    assert [r.request_id for r, _ in plan.scheduled] == ["first"]


def test_out_of_blocks_preempts_the_last_running_request_by_recompute() -> None:
    scheduler = _scheduler(blocks=5, block_size=4, budget=64)  # 4 usable blocks
    a, b = _request("a", 7), _request("b", 7)
    scheduler.add(a)
    scheduler.add(b)
    scheduler.schedule()  # a and b each take 2 blocks: the pool is full
    _finish_step(scheduler)
    scheduler.schedule()  # the 8th token of each still fits in its second block
    _finish_step(scheduler)
    plan = scheduler.schedule()  # a's 9th token needs a third block: b (the last) goes
    assert plan.preempted == 1
    assert b.status == PREEMPTED and b.num_computed_tokens == 0 and b.blocks == []
    assert a.status == RUNNING and [r.request_id for r, _ in plan.scheduled] == ["a"]
    assert scheduler.num_preemptions == 1
    scheduler.finish(a, "length")
    plan = scheduler.schedule()  # b comes back, recomputing its prompt and output
    assert b.status == RUNNING
    assert scheduler.stats.preempted_queries == 9


def test_priority_preemption_evicts_the_least_important() -> None:
    scheduler = _scheduler(blocks=5, block_size=4, policy="priority")
    low = _request("low", 7, priority=5, arrival=0.0)
    high = _request("high", 7, priority=0, arrival=1.0)
    scheduler.add(low)
    scheduler.add(high)
    for _ in range(2):
        scheduler.schedule()
        _finish_step(scheduler)
    scheduler.schedule()
    assert low.status == PREEMPTED and high.status == RUNNING


def test_abort_frees_blocks_at_once() -> None:
    scheduler = _scheduler()
    request = _request("a", 9)
    scheduler.add(request)
    scheduler.schedule()
    pool = scheduler.manager.pool
    assert pool.num_free < pool.num_blocks - 1
    scheduler.finish(request, "abort")
    assert pool.num_free == pool.num_blocks - 1 and not scheduler.has_work()


def test_prefix_hits_are_counted_in_tokens_as_vllm_does() -> None:
    scheduler = _scheduler()
    first = _request("a", 9)
    scheduler.add(first)
    scheduler.schedule()
    scheduler.finish(first, "length")
    again = _request("a", 9)
    scheduler.add(again)
    plan = scheduler.schedule()
    assert plan.scheduled == [(again, 1)]  # only the uncached tail is computed
    assert (scheduler.stats.queries, scheduler.stats.hits) == (18, 8)
    assert again.prompt_cached_tokens == 8
