"""Prefix reuse in tokenization: ids always equal a full encode."""

import gc
import json
import random
import weakref
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hiveroute.bench.workloads.text import filler
from hiveroute.kvindex.blocks import block_keys
from hiveroute.kvindex.prefix_cache import (
    SEGMENT_SAFE_PATTERNS,
    PrefixEncodeCache,
    _common_prefix,
    _Entry,
    _Family,
    any_token_start,
    byte_level_split,
    prefix_block_keys,
    reused_tokens,
    tokenizer_splits_from_text,
    tokenizer_supports_prefix_reuse,
)
from hiveroute.kvindex.tokenizer import (
    _ASCII_PIECE,
    _PIECE,
    BuiltinTokenizer,
    HFTokenizer,
    piece_boundary,
    prompt_token_ids,
)
from tests.support.prompts import role_first_messages

WORDS = "the agent plan tool résumé 42 café, x.y: don't  foo\nbar\t baz ünï 🙂 <s> result".split(
    " "
)


@pytest.mark.parametrize("kind", ["hf", "builtin"])
def test_growing_and_branching_texts_encode_exactly(tokenizer_dir: Path, kind: str) -> None:
    tok = HFTokenizer(tokenizer_dir) if kind == "hf" else BuiltinTokenizer()
    assert tok.prefix_cache is not None
    rng = random.Random(7)
    text = ""
    for _ in range(25):
        text += rng.choice(["", " ", "\n", ". ", "  "]) + " ".join(
            rng.choice(WORDS) for _ in range(rng.randint(1, 600))
        )
        for special in (True, False):
            assert tok.encode(text, add_special_tokens=special) == tok.encode_uncached(
                text, add_special_tokens=special
            )
        branch = text[: rng.randint(0, len(text))] + rng.choice([" zz", "zz", "\n", " 7", ","])
        assert tok.encode(branch) == tok.encode_uncached(branch)
    assert tok.prefix_cache.hits > 10  # the cache was actually used


def test_chat_requests_reuse_earlier_turns(tokenizer_dir: Path) -> None:
    tok = HFTokenizer(tokenizer_dir)
    messages = [{"role": "system", "content": " ".join(WORDS * 300)}]
    for turn in range(6):
        messages.append({"role": "user", "content": f"question {turn} " + " ".join(WORDS[:5])})
        body = {"messages": messages}
        ids = prompt_token_ids(tok, "/v1/chat/completions", body)
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
        assert ids == tok.encode_uncached(text, add_special_tokens=False)
        messages.append({"role": "assistant", "content": "answer " * 30})
    assert tok.prefix_cache is not None and tok.prefix_cache.reused_tokens > 0


def test_tokenizers_where_splitting_is_unsafe_encode_whole(tokenizer_dir: Path) -> None:
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    assert tokenizer_supports_prefix_reuse(json.dumps(spec))
    for change in (
        {"normalizer": {"type": "NFC"}},
        {"pre_tokenizer": {"type": "Metaspace", "replacement": "▁"}},
        {"added_tokens": [*spec["added_tokens"], {"content": "a b", "id": 9999}]},
    ):
        assert not tokenizer_supports_prefix_reuse(json.dumps({**spec, **change}))
    assert not tokenizer_supports_prefix_reuse("not json")


@pytest.mark.parametrize("salt", [None, "tenant-salt"])
def test_block_keys_of_a_shared_prefix_are_reused_and_equal_a_full_keying(salt: str | None) -> None:
    tokenizer = BuiltinTokenizer()
    rng = random.Random(7)
    words = [f"w{i}" for i in range(400)]
    context = " ".join(rng.choice(words) for _ in range(1500))
    reused = 0
    for turn in range(8):  # agents of one workflow: the context, then each its own message
        own = " ".join(rng.choice(words) for _ in range(40 + turn))
        tokens = tokenizer.encode(f"{context} agent {turn % 3}: {own}", add_special_tokens=False)
        for size in (16, 128):
            keys = prefix_block_keys(tokens, size, salt=salt)
            assert keys == block_keys(list(tokens), size, salt=salt)
        reused += getattr(tokens, "reused", 0)
    assert reused > 0  # the context's keys came from the cache, not a new keying


def test_interleaved_workflows_keep_their_contexts_encodings() -> None:
    """Eight workflows' agents take turns; each prompt is its workflow's context and the
    agent's own message. With room for 16 encodings, every request after each workflow's
    first reuses its context: the least recently stored entry goes, not a whole family."""
    rng = random.Random(3)
    words = [f"w{i}" for i in range(500)]
    contexts = [" ".join(rng.choice(words) for _ in range(800)) for _ in range(8)]
    tok = BuiltinTokenizer()
    tok.prefix_cache.max_entries = 16
    for step in range(200):
        w = (step * 5 + step // 8) % 8  # an irregular interleaving of the eight
        own = " ".join(rng.choice(words) for _ in range(30))
        text = f"Workflow {w}.\n{contexts[w]}\nAgent step {step}: {own}"
        assert tok.encode(text) == tok.encode_uncached(text)
    assert tok.prefix_cache.hits == 200 - 8


@given(st.text(alphabet="ab ", max_size=40), st.text(alphabet="ab ", max_size=40))
def test_the_common_prefix_is_the_longest_shared_start(a: str, b: str) -> None:
    n = _common_prefix(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


def test_an_evicted_encoding_is_freed_though_later_ids_reused_it() -> None:
    """Token ids keep the keys of the encoding they reused, not the encoding: otherwise every
    prompt ever seen stays alive through the chain of ids that reused it."""
    tok = BuiltinTokenizer()
    cache = tok.prefix_cache
    cache.max_entries = 4
    base = " ".join(f"w{i}" for i in range(1000))
    gc.disable()  # freed by reference counting alone: no cycle holds it either
    try:
        first = tok.encode(base + " a0")
        (_, oldest), *_ = cache._order.values()
        freed = weakref.ref(oldest)
        del oldest
        later = [tok.encode(base + f" a{i}") for i in range(1, 10)]  # each reuses the one before
        del first
        assert cache.hits == 9 and len(later) == 9
        assert freed() is None
    finally:
        gc.enable()


def test_each_of_many_sessions_sharing_a_prompt_reuses_its_own_history() -> None:
    """128 chat sessions share a system prompt and take turns. Each turn extends the session's
    own previous prompt, so it must reuse that encoding whole (up to the back-off at the end),
    not only the system prompt some other session's entry also has. At 64 entries every
    session's encoding was gone by its next turn."""
    rng = random.Random(5)
    words = [f"w{i}" for i in range(300)]
    system = " ".join(rng.choice(words) for _ in range(600))
    tok = BuiltinTokenizer()
    histories = {s: f"{system}\nsession {s}: " + " ".join(rng.choice(words) for _ in range(200))
                 for s in range(128)}  # fmt: skip
    previous = {s: len(tok.encode(histories[s])) for s in histories}
    for _ in range(2):
        for s, history in histories.items():
            history += " " + " ".join(rng.choice(words) for _ in range(20))
            histories[s] = history
            ids = tok.encode(history)
            assert ids == tok.encode_uncached(history)
            assert reused_tokens(ids) >= previous[s] - 2  # all but the last piece or two
            previous[s] = len(ids)
    assert len(tok.prefix_cache) == 128  # each turn superseded the session's last


def test_the_cache_holds_at_most_its_token_budget_and_always_the_newest() -> None:
    tok = BuiltinTokenizer()
    cache = tok.prefix_cache
    cache.max_tokens = 5000
    texts = [f"text {i}: " + " ".join(f"w{i}x{j}" for j in range(1000)) for i in range(6)]
    for text in texts:
        tok.encode(text)
        assert cache.tokens <= cache.max_tokens
    assert cache.tokens > 0 and len(cache) < len(texts)
    huge = "huge: " + " ".join(f"h{j}" for j in range(4000))  # alone over the budget
    tok.encode(huge)
    assert len(cache) == 1 and cache.tokens == len(tok.encode_uncached(huge))
    # the survivor is the newest: encoding it again reuses it
    assert reused_tokens(tok.encode(huge + " more")) > 0


def test_a_model_tokenizer_reports_each_token_start_as_its_offsets_say(
    tokenizer_dir: Path,
) -> None:
    tok = HFTokenizer(tokenizer_dir)
    text = "Plan the trip, then book it.\n  Two  spaces and 'quotes' ünïcödé."
    ids, starts = tok._encode_with_offsets(text, True)
    encoding = tok._tok.encode(text, add_special_tokens=True)
    assert ids == encoding.ids
    assert starts.tolist() == [start for start, _ in encoding.offsets]
    assert starts.dtype == np.int64


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=60))
def test_the_builtin_tokenizers_ascii_pieces_are_its_unicode_pieces(text: str) -> None:
    """ASCII text is split by a faster pattern; every ASCII character, separators and control
    characters included, must land in the same pieces as under the Unicode pattern."""
    assert text.isascii()
    assert _ASCII_PIECE.findall(text) == _PIECE.findall(text)


def test_the_builtin_tokenizer_encodes_ascii_and_other_text_alike() -> None:
    tokenizer = BuiltinTokenizer()
    ascii_text = "".join(map(chr, range(128))) + " word, x\x1cy\x1f z"
    mixed = ascii_text + " é"  # one character outside ASCII: the Unicode pattern
    ids = tokenizer.encode_uncached(mixed, add_special_tokens=False)
    assert tokenizer.encode_uncached(ascii_text, add_special_tokens=False) == ids[: len(ids) - 2]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet="ab ", max_size=12), max_size=12),
    st.text(alphabet="ab ", max_size=12),
)
def test_a_family_finds_the_entry_sharing_the_longest_prefix(texts: list[str], text: str) -> None:
    family = _Family()
    entries = [_Entry(t, [], np.zeros(0, np.int64)) for t in texts]
    for entry in entries:
        family.add(entry)
    assert family.texts == sorted(texts)
    best, common = family.nearest(text)
    longest = max((_common_prefix(t, text) for t in texts), default=0)
    assert common == longest
    assert (best is None) == (longest == 0)
    if best is not None:
        assert _common_prefix(best.text, text) == longest
    for entry in entries:  # each is found among equal texts by identity, and removed
        assert family.remove(entry)
        assert not family.remove(entry)
    assert family.texts == [] and family.entries == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*WORDS, "", " ", "\n", "_", "x_1"]), max_size=14), st.data())
def test_a_builtin_piece_ends_exactly_where_cutting_the_text_keeps_its_ids(
    words: list[str], data: st.DataObject
) -> None:
    text = "a " + " ".join(words) + "."
    pos = data.draw(st.integers(min_value=1, max_value=len(text) - 1))
    tok = BuiltinTokenizer()
    whole = tok.encode_uncached(text, add_special_tokens=False)
    cut = tok.encode_uncached(text[:pos], add_special_tokens=False) + tok.encode_uncached(
        text[pos:], add_special_tokens=False
    )
    assert piece_boundary(text, pos) == (whole == cut)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([*WORDS, "", " ", "\n", "-", "'s", "x1"]), max_size=30))
def test_a_byte_level_split_from_the_text_alone_keeps_a_gpt2_style_tokenizers_ids(
    hf_tokenizer: HFTokenizer, words: list[str]
) -> None:
    text = " ".join(words) + " end"
    whole = hf_tokenizer.encode_uncached(text, add_special_tokens=False)
    for pos in range(1, len(text) - 1):
        if byte_level_split(text, pos):
            cut = hf_tokenizer.encode_uncached(
                text[:pos], add_special_tokens=False
            ) + hf_tokenizer.encode_uncached(text[pos:], add_special_tokens=False)
            assert cut == whole, (text, pos)


@pytest.fixture(scope="module")
def hf_tokenizer(tokenizer_dir: Path) -> HFTokenizer:
    return HFTokenizer(tokenizer_dir)


@pytest.mark.parametrize("one_message", [True, False])
@pytest.mark.parametrize("kind", ["hf", "builtin"])
def test_a_context_behind_each_agents_own_role_prompt_is_tokenized_once(
    tokenizer_dir: Path, kind: str, one_message: bool
) -> None:
    """Role first: the workflow's context follows a prompt of each agent's own, so it shares no
    prefix with a sibling's prompt; it is still tokenized once, and ids equal a full encode."""
    tok = HFTokenizer(tokenizer_dir) if kind == "hf" else BuiltinTokenizer()
    cache = tok.prefix_cache
    assert cache is not None
    header = "The documents of this workflow follow; read them all before you act. " * 6
    for workflow in range(3):  # each context begins alike: the whole prompts share that much
        context = header + f"Workflow {workflow}: " + filler(12_000, "context", workflow)
        context_tokens = len(tok.encode_uncached(context, add_special_tokens=False))
        for step, role in enumerate(["planner", "executor", "validator", "executor"]):
            messages = role_first_messages(
                role, context, f"step {step}: do {role} things " * 2, one_message=one_message
            )
            before = cache.reused_tokens
            ids = prompt_token_ids(tok, "/v1/chat/completions", {"messages": messages})
            text = tok.apply_chat_template(messages, add_generation_prompt=True)
            assert ids == tok.encode_uncached(text, add_special_tokens=False)
            if step > 0:  # every agent after the first reuses most of the context's tokens
                assert cache.reused_tokens - before > 0.7 * context_tokens
        # the planner's next step grows its own prompt: reused whole, its block keys with it
        messages = role_first_messages(
            "planner", context, "step 0: do planner things " * 2, one_message=one_message
        )
        messages += [
            {"role": "assistant", "content": "the plan " * 20},
            {"role": "user", "content": "now the next step"},
        ]
        ids = prompt_token_ids(tok, "/v1/chat/completions", {"messages": messages})
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
        assert ids == tok.encode_uncached(text, add_special_tokens=False)
        assert reused_tokens(ids) > context_tokens


def test_byte_level_tokenizers_split_from_the_text_alone_only_under_known_patterns(
    tokenizer_dir: Path,
) -> None:
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    assert spec["pre_tokenizer"]["type"] == "ByteLevel"  # GPT-2's own regex
    assert tokenizer_splits_from_text(json.dumps(spec))
    llama3 = next(p for p in SEGMENT_SAFE_PATTERNS if p.startswith("(?i:") and "{1,3}" in p)

    def split_then_byte_level(pattern: str, use_regex: bool = False) -> str:
        pre = {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated"},
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": use_regex},
            ],
        }
        return json.dumps({**spec, "pre_tokenizer": pre})

    assert tokenizer_splits_from_text(split_then_byte_level(llama3))
    assert not tokenizer_splits_from_text(split_then_byte_level(r"\w+|\s+"))
    assert not tokenizer_splits_from_text(split_then_byte_level(llama3, use_regex=True))
    no_regex = {**spec["pre_tokenizer"], "use_regex": False}
    assert not tokenizer_splits_from_text(json.dumps({**spec, "pre_tokenizer": no_regex}))
    assert not tokenizer_splits_from_text(json.dumps({**spec, "normalizer": {"type": "NFC"}}))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_chunks_of_a_context_at_any_offset_leave_the_ids_of_a_full_encode(
    hf_tokenizer: HFTokenizer, data: st.DataObject
) -> None:
    """Wherever a shared context sits, whatever comes before and after it (cut into chunks or
    not, found again or not), the ids are a full encode's."""
    tok = data.draw(st.sampled_from([BuiltinTokenizer(), hf_tokenizer]))
    assert tok.prefix_cache is not None
    rng = random.Random(data.draw(st.integers(0, 2**16)))
    context = filler(data.draw(st.integers(600, 6000)), "context", rng.random())
    for _ in range(4):
        head = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 60)))
        tail = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 600)))
        text = head + rng.choice(["", " ", "\n", "x"]) + context + rng.choice(["", " "]) + tail
        for special in (False, True):
            ids = tok.encode(text, add_special_tokens=special, chunked=True)
            assert ids == tok.encode_uncached(text, add_special_tokens=special)


def test_chunks_no_text_used_again_hold_at_most_a_quarter_of_the_cache() -> None:
    """Unique long prompts (a trace's conversations) keep their chunks on probation: those
    never take more than a quarter of the cache, and a chunk found again leaves probation."""
    tok = BuiltinTokenizer()
    cache = PrefixEncodeCache(
        tok._encode_with_offsets,
        safe_split=any_token_start,
        segment_split=piece_boundary,
        max_tokens=60_000,
    )
    contexts = [filler(8000, "unique", i) for i in range(12)]
    for i, context in enumerate(contexts):
        text = f"conversation {i} opens. " + context
        ids = cache.encode(text, False, chunked=True)
        assert ids == tok.encode_uncached(text, add_special_tokens=False)
        assert cache._probation_tokens <= cache.max_tokens // 4
    assert cache._probation  # some chunks are kept, on probation
    sibling = "another agent, another role prompt. " + contexts[-1]
    before = cache.reused_tokens
    ids = cache.encode(sibling, False, chunked=True)
    assert ids == tok.encode_uncached(sibling, add_special_tokens=False)
    context_tokens = len(tok.encode_uncached(contexts[-1], add_special_tokens=False))
    assert cache.reused_tokens - before > 0.7 * context_tokens
    found_again = [e for _, e in cache._order.values() if contexts[-1][4000:4100] in e.text]
    assert found_again and not any(id(e) in cache._probation for e in found_again)


def test_a_completion_prompt_is_reused_by_prefix_only() -> None:
    """Chunks are looked for in chat prompts only: a completion's context behind another
    beginning is tokenized again (the trace's completions share blocks only as prefixes)."""
    tok = BuiltinTokenizer()
    context = filler(6000, "completion context")
    for head in ("first agent: ", "second agent: "):
        before = tok.prefix_cache.reused_tokens
        ids = prompt_token_ids(tok, "/v1/completions", {"prompt": head + context})
        assert ids == tok.encode_uncached(head + context)
    assert tok.prefix_cache.reused_tokens - before < 10
    chat = {"messages": [{"role": "user", "content": "third agent: " + context}]}
    before = tok.prefix_cache.reused_tokens
    prompt_token_ids(tok, "/v1/chat/completions", chat)
    prompt_token_ids(
        tok,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "fourth agent: " + context}]},
    )
    assert tok.prefix_cache.reused_tokens - before > 0.3 * len(tok.encode_uncached(context))


@pytest.mark.parametrize("kind", ["hf", "builtin"])
def test_a_head_is_the_whole_encodings_first_ids_and_is_not_kept(
    tokenizer_dir: Path, kind: str
) -> None:
    """A router tokenizes a prompt only as far as an engine could hold it before sending: the
    head's ids must be the whole text's first ids."""
    tok = HFTokenizer(tokenizer_dir) if kind == "hf" else BuiltinTokenizer()
    cache = tok.prefix_cache
    assert cache is not None
    text = filler(24_000, "head", 1)
    whole = tok.encode_uncached(text, add_special_tokens=True)
    found = tok.encode_head(text, add_special_tokens=True, beyond=1024)
    assert found is not None
    ids, end = found
    assert 1024 <= end < len(text) - 4096  # about the characters asked for, not the whole
    assert ids == whole[: len(ids)] == tok.encode_uncached(text[:end], add_special_tokens=True)
    assert len(cache) == 0  # not kept: the whole text is cut into chunks as without it
    assert tok.encode(text, add_special_tokens=True) == whole


def test_a_head_starts_past_what_the_cache_knows_of_the_text() -> None:
    tok = BuiltinTokenizer()
    earlier = filler(8_000, "turn", 1)
    tok.encode(earlier, add_special_tokens=False)
    text = earlier + " and the next turn, " + filler(8_000, "turn", 2)
    found = tok.encode_head(text, add_special_tokens=False, beyond=500)
    assert found is not None
    ids, end = found
    assert len(earlier) + 500 <= end < len(earlier) + 1000
    assert ids == tok.encode_uncached(text, add_special_tokens=False)[: len(ids)]


def test_a_text_with_little_left_or_a_tokenizer_that_cannot_cut_has_no_head(
    tokenizer_dir: Path,
) -> None:
    tok = BuiltinTokenizer()
    text = filler(5_000, "short", 1)[:5_000]
    assert tok.encode_head(text, add_special_tokens=False, beyond=4_000) is None  # 1k left
    assert tok.encode_head(text[:1000], add_special_tokens=False, beyond=100) is None
    whole_only = PrefixEncodeCache(BuiltinTokenizer()._encode_with_offsets, segment_split=None)
    assert whole_only.encode_head(filler(20_000, "x", 1), False, beyond=100) is None
