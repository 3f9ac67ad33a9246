"""The placement replay (benchmarks/trace_cache_bound.py) on a trace small enough to reason about."""

from __future__ import annotations

from pathlib import Path

from benchmarks.trace_cache_bound import fleet, kv_rule, replay
from hiveroute.bench.workloads.trace import TraceConfig, TraceRow, TraceWorkload
from hiveroute.kvindex.tokenizer import BuiltinTokenizer

ROWS = [
    TraceRow(0, 1024, 4, (1, 2)),  # a conversation's first turn
    TraceRow(100, 700, 4, (9,)),  # another, sharing nothing
    TraceRow(200, 1100, 4, (1, 2, 3)),  # the first conversation's second turn
]


def setup() -> tuple[TraceWorkload, list[list[int]]]:
    workload = TraceWorkload(TraceConfig(path=Path("unused"), max_output_tokens=4), ROWS)
    tokenizer = BuiltinTokenizer()
    return workload, [tokenizer.encode(workload.prompt(row)) for row in workload.rows]


def test_the_kv_rule_keeps_a_conversation_and_spreads_new_ones() -> None:
    workload, prompts = setup()
    engines = fleet(2, 1000, 16)
    outcome = replay(workload, prompts, engines, kv_rule(0.02), 16)
    one = replay(workload, prompts, fleet(1, 2000, 16), lambda es, r, t: es[0], 16)
    # the second turn found its first turn's 1024 tokens (whole blocks), as in one cache
    assert outcome.hit_tokens == one.hit_tokens == 1024
    assert outcome.prompt_tokens == sum(len(p) for p in prompts)
    # the unrelated conversation went to the engine nobody had written to
    first, second = outcome.written
    assert second == len(prompts[1])
    assert first == len(prompts[0]) + len(prompts[2]) - 1024


def test_a_cache_too_small_for_both_conversations_keeps_the_head_of_the_first() -> None:
    workload, prompts = setup()
    # one engine of 79 usable blocks: the second conversation (512 tokens) evicts the first's
    # last blocks, which vLLM frees first, so its second turn still finds the head
    small = replay(workload, prompts, fleet(1, 80, 16), lambda es, r, t: es[0], 16)
    assert 0 < small.hit_tokens < 1024
    big = replay(workload, prompts, fleet(1, 10**4, 16), lambda es, r, t: es[0], 16)
    assert big.hit_tokens == 1024
