from __future__ import annotations

from pathlib import Path

import pytest

from hiveroute.bench.workloads.trace import TraceConfig, TraceRow, TraceWorkload, read_trace
from hiveroute.errors import ConfigError
from hiveroute.kvindex.tokenizer import BuiltinTokenizer
from tests.bench.helpers import run_units

TOK = BuiltinTokenizer()


def tokens(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def workload(rows: list[TraceRow], **kw: object) -> TraceWorkload:
    return TraceWorkload(TraceConfig(path=Path("unused"), **kw), rows)  # type: ignore[arg-type]


ROWS = [
    TraceRow(0, 1200, 10, (1, 2, 3)),  # 512 + 512 + 176
    TraceRow(500, 1100, 20, (1, 2, 4)),  # shares blocks 1, 2 with the first
    TraceRow(1500, 700, 5, (5, 6)),  # shares nothing
    TraceRow(2000, 512, 5, (1,)),
]


def test_prompt_length_is_the_traces_input_length() -> None:
    w = workload(ROWS)
    for row in ROWS:
        assert len(tokens(w.prompt(row))) == row.input_length


def test_equal_hash_ids_give_equal_blocks_and_unequal_ones_differ() -> None:
    w = workload(ROWS)
    a, b, c = (tokens(w.prompt(r)) for r in ROWS[:3])
    assert a[:1024] == b[:1024]  # hash ids 1, 2 shared
    assert a[1024] != b[1024]  # 3 vs 4: the third block differs from its first token
    assert a[0] != c[0]  # 1 vs 5
    whole_block = tokens(w.prompt(ROWS[3]))
    assert whole_block == a[:512]


def test_token_scale_keeps_the_block_structure() -> None:
    w = workload(ROWS, token_scale=0.25)
    assert w.config.block_tokens == 128
    a, b = (tokens(w.prompt(r)) for r in ROWS[:2])
    assert len(a) == 300
    assert a[:256] == b[:256] and a[256] != b[256]


def test_arrivals_follow_the_trace_scaled_by_speed() -> None:
    assert [u.arrival_s for u in workload(ROWS).units()] == [0.0, 0.5, 1.5, 2.0]
    assert [u.arrival_s for u in workload(ROWS, speed=2.0).units()] == [0.0, 0.25, 0.75, 1.0]


async def test_units_send_one_completion_each_with_the_trace_output_length() -> None:
    w = workload(ROWS, max_output_tokens=8, namespace="runx")
    contexts = await run_units(list(w.units()))
    sent = [c.sent[0] for c in contexts]
    assert [r.max_tokens for r in sent] == [8, 8, 5, 5]
    assert all(r.prompt and r.prompt.startswith("runx ") and r.messages is None for r in sent)


def test_read_trace_limits_and_rejects_bad_lines(tmp_path: Path) -> None:
    good = '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}\n'
    path = tmp_path / "t.jsonl"
    path.write_text(good * 5)
    assert len(read_trace(path, 3)) == 3
    assert len(read_trace(path, 0)) == 5
    path.write_text(good + '{"timestamp": 0}\n')
    with pytest.raises(ConfigError, match=":2:"):
        read_trace(path, 0)
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_trace(tmp_path / "missing.jsonl", 0)
    path.write_text("")
    with pytest.raises(ConfigError, match="no requests"):
        read_trace(path, 0)


def test_a_later_slice_starts_after_the_skipped_rows_and_keeps_their_numbers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.jsonl"
    lines = [
        f'{{"timestamp": {1000 * i}, "input_length": 600, "output_length": 3, "hash_ids": [{i}]}}'
        for i in range(5)
    ]
    path.write_text("\n".join(lines) + "\n")
    rows = read_trace(path, 2, skip=3)
    assert [r.hash_ids for r in rows] == [(3,), (4,)]
    w = TraceWorkload(TraceConfig(path=path, limit=2, skip=3))
    units = list(w.units())
    assert [u.unit_id for u in units] == ["trace-3", "trace-4"]
    assert [u.arrival_s for u in units] == [0.0, 1.0]  # timed from the slice's first row
    with pytest.raises(ConfigError, match="no requests after the first 5"):
        read_trace(path, 0, skip=5)


def test_the_mooncake_trace_replays_with_shared_prefixes() -> None:
    from hiveroute.bench.workloads.trace import default_trace_path

    path = default_trace_path()
    if not path.exists():
        pytest.fail(f"the Mooncake trace is expected at {path}")
    rows = read_trace(path, 20)
    w = workload(rows, token_scale=0.05)
    prompts = [tokens(w.prompt(r)) for r in rows[:3]]
    block = w.config.block_tokens
    assert rows[0].hash_ids[0] == rows[1].hash_ids[0]
    assert prompts[0][:block] == prompts[1][:block]
    assert prompts[0][block] != prompts[1][block]
