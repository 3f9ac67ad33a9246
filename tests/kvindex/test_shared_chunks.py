"""The workers of one router share the chunks of prompts each has tokenized."""

import logging
from pathlib import Path

import numpy as np
import pytest

from hiveroute.bench.workloads.text import filler
from hiveroute.kvindex.prefix_cache import (
    EncodeWithOffsets,
    PrefixEncodeCache,
    any_token_start,
    byte_level_split,
)
from hiveroute.kvindex.shared_chunks import (
    SUFFIX,
    SharedChunksCollector,
    SharedChunkStore,
    Starts,
    chunk_name,
)
from hiveroute.kvindex.tokenizer import BuiltinTokenizer, HFTokenizer, piece_boundary
from tests.support.prompts import role_first_messages


def _starts(count: int) -> Starts:
    return np.arange(count, dtype=np.int64) * 3


def test_a_chunk_one_worker_stored_is_read_by_another(tmp_path: Path) -> None:
    first = SharedChunkStore(tmp_path, max_tokens=1000)
    second = SharedChunkStore(tmp_path, max_tokens=1000)
    assert second.get("a chunk of text") is None
    first.put("a chunk of text", [7, 8, 9], _starts(3))
    ids, starts = second.get("a chunk of text") or ([], _starts(0))
    assert ids == [7, 8, 9] and starts.tolist() == [0, 3, 6]
    assert second.get("another chunk") is None
    second.put("a chunk of text", [7, 8, 9], _starts(3))  # there already: not written again
    assert (first.published, second.published, second.found) == (1, 0, 1)


def test_a_torn_or_foreign_file_is_a_miss(tmp_path: Path) -> None:
    store = SharedChunkStore(tmp_path, max_tokens=1000)
    store.put("chunk", [1, 2, 3, 4], _starts(4))
    path = tmp_path / (chunk_name("chunk") + SUFFIX)
    path.write_bytes(path.read_bytes()[:-8])  # one value short
    assert store.get("chunk") is None
    path.write_bytes(b"")
    assert store.get("chunk") is None
    path.write_bytes(np.array([-1], dtype=np.int64).tobytes())
    assert store.get("chunk") is None
    store.put("big ids", [2**31], _starts(1))  # past what the files hold: not shared
    assert store.get("big ids") is None and store.published == 1


def test_each_worker_removes_its_oldest_chunks_past_its_share(tmp_path: Path) -> None:
    store = SharedChunkStore(tmp_path, max_tokens=10)
    for i in range(5):
        store.put(f"chunk {i}", [i] * 4, _starts(4))
    assert store.tokens <= 10
    assert [store.get(f"chunk {i}") is not None for i in range(5)] == [False] * 3 + [True] * 2
    assert len(list(tmp_path.glob("*" + SUFFIX))) == 2
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_a_write_that_fails_is_a_warning_once_never_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory that is gone (or full, or read-only): the workers tokenize on their own."""
    store = SharedChunkStore(tmp_path / "chunks", max_tokens=1000)
    (tmp_path / "chunks").rmdir()
    with caplog.at_level(logging.WARNING, logger="hiveroute.kvindex"):
        store.put("one", [1], _starts(1))
        store.put("two", [2], _starts(1))
    assert store.published == 0 and store.get("one") is None
    assert len([r for r in caplog.records if "cannot share" in r.message]) == 1


class _Counting:
    """An encode function that counts the characters it was given."""

    def __init__(self, encode: EncodeWithOffsets) -> None:
        self.encode = encode
        self.chars = 0

    def __call__(self, text: str, special: bool) -> tuple[list[int], Starts]:
        self.chars += len(text)
        return self.encode(text, special)


@pytest.mark.parametrize("layout", ["context_first", "role_first"])
@pytest.mark.parametrize("kind", ["hf", "builtin"])
@pytest.mark.parametrize("shared", [True, False])
def test_a_sibling_on_another_worker_reads_the_context_instead_of_tokenizing_it(
    tokenizer_dir: Path,
    tmp_path: Path,
    kind: str,
    layout: str,
    shared: bool,
) -> None:
    """Two workers (two caches, one directory): the planner's context, tokenized by one, is
    read by the other for its sibling's prompt; ids equal a full encode either way."""
    tok = HFTokenizer(tokenizer_dir) if kind == "hf" else BuiltinTokenizer()
    split, segments = (
        (byte_level_split, byte_level_split) if kind == "hf" else (any_token_start, piece_boundary)
    )
    workers = []
    for _ in range(2):
        counting = _Counting(tok._encode_with_offsets)
        store = SharedChunkStore(tmp_path, max_tokens=1_000_000) if shared else None
        cache = PrefixEncodeCache(counting, safe_split=split, segment_split=segments, shared=store)
        workers.append((counting, cache, store))
    context = filler(20_000, "shared context")
    for i, ((counting, cache, _), role) in enumerate(
        zip(workers, ["planner", "executor"], strict=True)
    ):
        own = f"step {i}: do {role} things"
        if layout == "context_first":
            messages = [
                {"role": "system", "content": "The workflow's documents.\n" + context},
                {"role": "user", "content": own},
            ]
        else:
            messages = role_first_messages(role, context, own, one_message=True)
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
        before = counting.chars
        assert cache.encode(text, False, chunked=True) == tok.encode_uncached(
            text, add_special_tokens=False
        )
    counting, _, store = workers[1]
    encoded = counting.chars - before
    if shared:  # the executor's worker tokenized its own head and tail, not the context
        assert encoded < 0.3 * len(context)
        assert store is not None and store.found > 0
    else:
        assert encoded > len(context)


def test_the_counts_are_prometheus_counters(tmp_path: Path) -> None:
    store = SharedChunkStore(tmp_path, max_tokens=100)
    store.put("chunk", [1, 2], _starts(2))
    store.get("chunk")
    [family] = list(SharedChunksCollector(store).collect())
    assert family.name == "hiveroute_tokenizer_shared_chunks"
    assert {s.labels["outcome"]: s.value for s in family.samples} == {"found": 1, "published": 1}
