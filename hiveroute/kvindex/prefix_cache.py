"""Reusing the tokens of a text's prefix: agentic prompts repeat long prefixes.

A 20k-token prompt that extends the previous one by 1k tokens should cost 1k tokens of work.
`PrefixEncodeCache` keeps recent encodings (text, ids, token start offsets); for a new text it
finds the cached text sharing the longest prefix, backs off to a split point where the encoding
cannot depend on what follows, and encodes only the rest.

Where is that safe? A byte-level BPE (GPT-2, Llama 3, Qwen) first splits text with a regex;
merges never cross those splits. A space followed by a letter always starts a new split when
the character before it is not whitespace (" word" is one pre-token in both regexes), so if the
cached encoding has a token starting exactly there, tokens before it are final. Tokenizers
without a byte-level pre-tokenizer, with a normalizer, or with special tokens containing a
space are encoded whole (the cache disables itself), so ids always equal a full encode.

A long part that recurs after different beginnings (an agentic workflow's shared context
behind each agent's own role prompt: "role first") shares no prefix with the prompts before it.
So past the point where a text leaves its best cached prefix, it is cut into chunks at points
chosen by its content alone, as deduplicating stores do: a space before a letter (a split that
leaves tokens on both sides final, from the text alone: `segment_split`) where a hash of the 8
characters before it has its top 10 bits zero, about every 7,000 characters, and no closer than
MIN_CACHED_CHARS to the last cut. The same context behind another role prompt is cut at the
same points, so its chunks are found again, each through the cache as a text of its own; only
the text from the divergence to the first cut and each chunk's last word are tokenized again.
A text none of whose chunks is known is encoded in one go, and its chunks are kept as slices
of that encoding. Chunks are looked for in chat prompts (`chunked`: where agents put a prompt
of their own before a shared context) of ASCII text (where byte offsets are character
offsets); completion prompts and other text reuse prefixes alone: the Mooncake trace's
completions share blocks only as prefixes, and looking for chunks there cost 0.1-0.2 ms of
router time a request.

Under `serve --workers` each worker has its own cache, and one workflow's agents reach all of
them; a cache given the workers' `SharedChunkStore` (shared_chunks.py) writes the chunks it
tokenized there and reads a chunk it does not know from there before tokenizing it.

Finding the cached text that shares the longest prefix costs two comparisons, not one per
entry: entries are kept sorted by text, and the one sharing the most with a new text is next to
where the new text would sort (every text sorted between two others shares at least what those
two share). Chat sessions that all begin with one system prompt are one family of entries; a
scan of it cost a third of a millisecond a request at a thousand sessions.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hiveroute.kvindex.blocks import BlockKey, block_keys
from hiveroute.kvindex.shared_chunks import SharedChunkStore, Starts

# Encode(text, add_special_tokens) -> (ids, start offset of each token in text)
EncodeWithOffsets = Callable[[str, bool], tuple[list[int], Starts]]
# (text, pos) -> whether a token that starts at pos makes every token before it final, whatever
# follows; pos and pos + 1 lie inside the text's common prefix with the cached one.
SplitRule = Callable[[str, int], bool]

MIN_CACHED_CHARS = 2048  # shorter texts are cheap to encode whole
# The cache should hold an encoding for every context that will come back (a session's next
# turn, an agent's next step): at 64 entries, 128 chat sessions each found theirs evicted and
# were tokenized whole every turn. The bounds are memory: about 20-40 bytes a token held.
MAX_ENTRIES = 1024
MAX_TOKENS = 2_000_000
_PROBE = 256  # characters that pick candidate entries (a prefix shorter than this is no win)
_MAX_BACKOFF_TOKENS = 256
# content-defined chunks: a split is a cut where a hash of the 8 characters before it has its
# top 10 bits zero; with a split before about every seventh character of English-like text, a
# cut every ~7,000 characters (a 32k-token context is about 20 chunks)
_CHUNK_WINDOW = 8
_CHUNK_BITS = np.uint64(64 - 10)
_CHUNK_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: top bits mix all


# (block size, salt) -> one encoding's block keys, once a request keyed them
KeysBySize = dict[tuple[int, str | None], list[BlockKey]]


@dataclass(eq=False)
class _Entry:
    text: str
    ids: list[int]
    # each token's start offset in text: machine ints, which the garbage collector does not walk
    # (64 long prompts' offsets as lists were a million references per full collection), which
    # a prefix copies as one block of memory and a new tail shifts in one operation
    starts: Starts
    keys: KeysBySize = field(default_factory=dict)


@dataclass(eq=False)
class _Family:
    """The entries whose texts begin alike (the same first `_PROBE` characters), sorted by
    text: `texts[i]` is `entries[i].text`."""

    texts: list[str] = field(default_factory=list)
    entries: list[_Entry] = field(default_factory=list)

    def nearest(self, text: str) -> tuple[_Entry | None, int]:
        """The entry sharing the longest prefix with `text`, and how many characters it
        shares: one of the two entries next to where `text` sorts."""
        i = bisect_left(self.texts, text)
        best: _Entry | None = None
        best_common = 0
        for j in (i, i - 1):  # at i, an equal text: all of it is shared
            if 0 <= j < len(self.texts):
                common = _common_prefix(self.texts[j], text)
                if common > best_common:
                    best, best_common = self.entries[j], common
        return best, best_common

    def add(self, entry: _Entry) -> None:
        i = bisect_left(self.texts, entry.text)
        self.texts.insert(i, entry.text)
        self.entries.insert(i, entry)

    def remove(self, entry: _Entry) -> bool:
        """Forget `entry` (found by its text, then by identity among equal texts)."""
        i = bisect_left(self.texts, entry.text)
        while i < len(self.texts) and self.texts[i] == entry.text:
            if self.entries[i] is entry:
                del self.texts[i], self.entries[i]
                return True
            i += 1
        return False


class PrefixIds(list[int]):
    """Token ids that remember the block keys of the cached encoding whose first `reused`
    tokens they share, so their own keys reuse those for that prefix (keyed once per prefix).
    The cache keeps this very list as its entry's ids (a 30k-token prompt is not copied
    again): read it, do not change it. It holds the two encodings' keys, not the encodings:
    a chain of entries, each holding the one before, would keep every prompt ever seen."""

    __slots__ = ("keys", "reused", "source_keys")

    keys: KeysBySize  # its own encoding's, filled as requests key it
    source_keys: KeysBySize | None
    reused: int


def reused_tokens(token_ids: Sequence[int]) -> int:
    """How many leading tokens `token_ids` share with an encoding the prefix cache made before
    (0 when they did not come from it)."""
    return token_ids.reused if isinstance(token_ids, PrefixIds) else 0


def reused_blocks(token_ids: Sequence[int], block_size: int) -> int:
    """How many leading full blocks `token_ids` share with an encoding made before."""
    return reused_tokens(token_ids) // block_size


def prefix_block_keys(
    token_ids: Sequence[int], block_size: int, *, salt: str | None = None
) -> list[BlockKey]:
    """`block_keys`, reusing the keys of the shared prefix when `token_ids` came from the
    prefix cache: a workflow's long context is keyed once, each request keys its new tail."""
    if not isinstance(token_ids, PrefixIds):
        return block_keys(token_ids, block_size, salt=salt)
    slot = (block_size, salt)
    keys: list[BlockKey] | None = None
    source = token_ids.source_keys
    previous = source.get(slot) if source is not None else None
    if previous:
        n = min(len(previous), token_ids.reused // block_size)
        if n:
            tail = block_keys(token_ids[n * block_size :], block_size, parent=previous[n - 1])
            keys = previous[:n] + tail
    if keys is None:
        keys = block_keys(token_ids, block_size, salt=salt)
    token_ids.keys[slot] = keys
    return keys


# a tokenizer.json, as text or parsed (a caller that asks twice parses it once)
TokenizerJson = str | Mapping[str, Any]


def _parsed(tokenizer_json: TokenizerJson) -> Mapping[str, Any] | None:
    if not isinstance(tokenizer_json, str):
        return tokenizer_json
    try:
        spec = json.loads(tokenizer_json)
    except ValueError:
        return None
    return spec if isinstance(spec, dict) else None


def _pre_tokenizers(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pre-tokenizer steps, in order (a Sequence's, or the one alone)."""
    pre = spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    return [p for p in parts if isinstance(p, dict)]


def tokenizer_supports_prefix_reuse(tokenizer_json: TokenizerJson) -> bool:
    """Whether splitting at ``<non-space> ␣<letter>`` is safe for this tokenizer.json."""
    spec = _parsed(tokenizer_json)
    if spec is None or spec.get("normalizer") is not None:
        return False
    if any(" " in str(t.get("content", "")) for t in spec.get("added_tokens") or []):
        return False
    kinds = [p.get("type") for p in _pre_tokenizers(spec)]
    return "ByteLevel" in kinds and all(k in ("ByteLevel", "Split", "Digits") for k in kinds)


# Pre-tokenizer regexes under which `byte_level_split` holds from the text alone: the piece
# before a "<non-space> ␣<letter>" position ends there (no pattern runs from a non-space into a
# space) and " <letter>..." starts one, as it would at the start of a text (no look-behind).
# GPT-2's (ByteLevel's own), Llama 3's (and OpenAI's cl100k) and Qwen 2's.
SEGMENT_SAFE_PATTERNS = frozenset(
    {
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    }
)


def tokenizer_splits_from_text(tokenizer_json: TokenizerJson) -> bool:
    """Whether `byte_level_split` is safe for this tokenizer.json without a cached encoding to
    confirm it: prefix reuse is, and the pre-tokenizer is ByteLevel with its own regex, or a
    Split on one of SEGMENT_SAFE_PATTERNS (isolated) before a ByteLevel without one."""
    spec = _parsed(tokenizer_json)
    if spec is None or not tokenizer_supports_prefix_reuse(spec):
        return False
    parts = _pre_tokenizers(spec)
    if [p.get("type") for p in parts] == ["ByteLevel"]:
        return bool(parts[0].get("use_regex", True))
    if [p.get("type") for p in parts] == ["Split", "ByteLevel"]:
        split, level = parts
        pattern = (split.get("pattern") or {}).get("Regex")
        return (
            pattern in SEGMENT_SAFE_PATTERNS
            and split.get("behavior") == "Isolated"
            and not split.get("invert", False)
            and not level.get("use_regex", True)
        )
    return False


def byte_level_split(text: str, pos: int) -> bool:
    """A byte-level BPE's safe split: a space then a letter, after a non-space."""
    return text[pos] == " " and text[pos + 1].isalpha() and not text[pos - 1].isspace()


def any_token_start(text: str, pos: int) -> bool:
    """Every token start is final (pre-tokenizers whose pieces end where the next begins)."""
    return True


class PrefixEncodeCache:
    """An LRU of recent encodings, used to encode only the new suffix of a text."""

    def __init__(
        self,
        encode: EncodeWithOffsets,
        *,
        max_entries: int = MAX_ENTRIES,
        max_tokens: int = MAX_TOKENS,
        safe_split: SplitRule = byte_level_split,
        segment_split: SplitRule | None = None,
        shared: SharedChunkStore | None = None,
    ) -> None:
        """`safe_split`: where a cached encoding's tokens before a position are final, given
        that the cached encoding has a token starting there. `segment_split`: where a text's
        tokens before and after a position are independent, from the text alone (None: the
        tokenizer has no such rule, and texts are not cut in chunks). `shared`: where the
        sibling workers' chunks are (shared_chunks.py); None with one worker."""
        if max_entries <= 0 or max_tokens <= 0:
            raise ValueError("max_entries and max_tokens must be positive")
        self._encode = encode
        self._safe_split = safe_split
        self._segment_split = segment_split
        self._shared = shared
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        # (add_special_tokens, first characters) -> that family of entries
        self._families: dict[tuple[bool, str], _Family] = {}
        # every entry, least recently stored first (keyed by identity; the entry keeps it alive)
        self._order: OrderedDict[int, tuple[tuple[bool, str], _Entry]] = OrderedDict()
        self._tokens = 0  # token ids held by all entries
        # chunks kept from a text and not used since (see _store), least recently kept first
        self._probation: OrderedDict[int, _Entry] = OrderedDict()
        self._probation_tokens = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._order)

    @property
    def tokens(self) -> int:
        """Token ids the cache holds, over all its entries."""
        return self._tokens

    def encode(self, text: str, add_special_tokens: bool, *, chunked: bool = False) -> list[int]:
        """`text`'s token ids, reusing the cached encoding that shares the longest prefix and,
        `chunked`, past it cached chunks of the same content (module doc)."""
        if len(text) < MIN_CACHED_CHARS:
            return self._encode(text, add_special_tokens)[0]
        return self._encode_entry(text, add_special_tokens, chunked=chunked).ids

    def encode_head(
        self, text: str, add_special_tokens: bool, *, beyond: int
    ) -> tuple[list[int], int] | None:
        """`text`'s first token ids and how many characters they cover (`end`): the tokens of
        `text[:end]`, where `end` is the first place at least `beyond` characters past what
        the nearest cached text shares with `text` at which the tokens before and after are
        independent (`segment_split`). A router needs a prompt's tokens only as far as an
        engine could hold them; the rest can wait until the request is on its way. The head is
        not kept: the whole text, encoded later, is cut into the chunks it would be cut into
        without it (a sibling worker finds them). None when the text cannot be cut by its
        content (no `segment_split`) or what would be left is short: encode it whole."""
        split = self._segment_split
        if split is None or len(text) < MIN_CACHED_CHARS:
            return None
        probe = (add_special_tokens, text[:_PROBE])
        best, common = self._nearest(probe, text)
        end = _split_from(text, common + max(1, beyond), split)
        if end is None or len(text) - end < MIN_CACHED_CHARS:
            return None
        ids = PrefixIds()
        _, source, reused = self._encode_after(best, common, text[:end], add_special_tokens, ids)
        ids.keys = {}
        ids.source_keys = source.keys if source is not None else None
        ids.reused = reused
        return ids, end

    def _encode_entry(self, text: str, add_special_tokens: bool, *, chunked: bool) -> _Entry:
        """Encode a text of at least MIN_CACHED_CHARS and keep it (its chunks too, `chunked`)."""
        probe = (add_special_tokens, text[:_PROBE])
        best, best_common = self._nearest(probe, text)
        cuts = self._chunk_cuts(text, best_common) if chunked else []
        bounds = list(zip(cuts, [*cuts[1:], len(text)], strict=True)) if cuts else []
        ids = PrefixIds()
        known = [(False, text[b : b + _PROBE]) in self._families for b, _ in bounds]
        from_siblings = self._siblings_chunks(text, bounds, known)
        if any(known) or from_siblings:
            # a chunk seen before: the head past the prefix, then each chunk through the cache
            # (or as a sibling worker encoded it)
            starts, source, reused = self._encode_after(
                best, best_common, text[: cuts[0]], add_special_tokens, ids
            )
            parts = [starts]
            for (begin, end), seen in zip(bounds, known, strict=True):
                chunk = text[begin:end]
                found = from_siblings.get(begin)
                if found is not None:  # a sibling's: as a chunk found again (off probation)
                    chunk_ids, chunk_starts = found
                    chunk_ids = self._keep(chunk, chunk_ids, chunk_starts, on_probation=False)
                else:
                    chunk_ids, chunk_starts = self._encode_chunk(chunk)
                    if not seen:
                        self._publish(chunk, chunk_ids, chunk_starts)
                ids.extend(chunk_ids)
                parts.append(chunk_starts + begin)
            starts = np.concatenate(parts)
        else:  # none seen: one encode past the prefix; its chunks kept, for the texts to come
            starts, source, reused = self._encode_after(
                best, best_common, text, add_special_tokens, ids
            )
            for begin, end in bounds:
                self._keep_chunk(text, begin, end, ids, starts)
        entry = _Entry(text, ids, starts)
        ids.keys = entry.keys
        # keys of the reused prefix only: the chunks' keys were keyed from their own starts
        ids.source_keys = source.keys if source is not None else None
        ids.reused = reused
        self._store(probe, entry, _extended(best, best_common))
        return entry

    def _encode_after(
        self,
        best: _Entry | None,
        common: int,
        text: str,
        add_special_tokens: bool,
        ids: list[int],
    ) -> tuple[Starts, _Entry | None, int]:
        """Encode `text` into `ids`, reusing `best`'s tokens up to the last safe split inside
        the `common` characters they share: (token starts, the entry reused, tokens reused)."""
        common = min(common, len(text))
        cut = _safe_cut(best, text, common, self._safe_split) if best is not None else None
        if best is None or cut is None:
            whole, starts = self._encode(text, add_special_tokens)
            ids.extend(whole)
            return starts, None, 0
        k, pos = cut
        tail_ids, tail_starts = self._encode(text[pos:], False)
        # slices copy at memcpy speed (an islice is walked element by element)
        ids.extend(best.ids[:k])
        ids.extend(tail_ids)
        self.hits += 1
        self.reused_tokens += k
        return np.concatenate((best.starts[:k], tail_starts + pos)), best, k

    def _encode_chunk(self, chunk: str) -> tuple[list[int], Starts]:
        """A chunk's ids and starts: through the cache (and kept) when long enough."""
        if len(chunk) < MIN_CACHED_CHARS:
            return self._encode(chunk, False)
        entry = self._encode_entry(chunk, False, chunked=False)
        return entry.ids, entry.starts

    def _keep_chunk(self, text: str, begin: int, end: int, ids: list[int], starts: Starts) -> None:
        """Keep `text[begin:end]`, its ids and starts sliced from the whole text's (a token
        starts at each cut: cuts are safe splits), on probation (see `_store`)."""
        if end - begin < MIN_CACHED_CHARS:
            return
        first, last = (int(i) for i in starts.searchsorted((begin, end)))
        if first >= len(ids) or starts[first] != begin:  # not a token start after all
            return
        chunk = text[begin:end]
        chunk_starts = starts[first:last] - begin
        chunk_ids = self._keep(chunk, ids[first:last], chunk_starts, on_probation=True)
        self._publish(chunk, chunk_ids, chunk_starts)

    def _siblings_chunks(
        self, text: str, bounds: list[tuple[int, int]], known: list[bool]
    ) -> dict[int, tuple[list[int], Starts]]:
        """The chunks this cache does not know and a sibling worker encoded, by start."""
        if self._shared is None:
            return {}
        found = {}
        for (begin, end), seen in zip(bounds, known, strict=True):
            if not seen and end - begin >= MIN_CACHED_CHARS:
                encoded = self._shared.get(text[begin:end])
                if encoded is not None:
                    found[begin] = encoded
        return found

    def _keep(self, chunk: str, ids: list[int], starts: Starts, *, on_probation: bool) -> PrefixIds:
        """Keep a chunk encoded elsewhere (sliced from a whole text's encoding, or by a
        sibling worker) as an entry of its own; its ids, as the entry holds them."""
        chunk_ids = PrefixIds(ids)
        entry = _Entry(chunk, chunk_ids, starts)
        chunk_ids.keys, chunk_ids.source_keys, chunk_ids.reused = entry.keys, None, 0
        probe = (False, chunk[:_PROBE])
        self._store(
            probe, entry, _extended(*self._nearest(probe, chunk)), on_probation=on_probation
        )
        return chunk_ids

    def _publish(self, chunk: str, ids: list[int], starts: Starts) -> None:
        """Offer a chunk this worker encoded to its siblings."""
        if self._shared is not None and len(chunk) >= MIN_CACHED_CHARS:
            self._shared.put(chunk, ids, starts)

    def _nearest(self, probe: tuple[bool, str], text: str) -> tuple[_Entry | None, int]:
        """The kept entry sharing the longest prefix with `text`, and how many characters."""
        family = self._families.get(probe)
        return family.nearest(text) if family is not None else (None, 0)

    def _chunk_cuts(self, text: str, after: int) -> list[int]:
        """Content-defined cut points past `after` (module doc), each a split `segment_split`
        confirms; none when less than two chunks' worth of text is left."""
        split = self._segment_split
        if split is None or len(text) - after < 2 * MIN_CACHED_CHARS or not text.isascii():
            return []  # (offsets of ASCII bytes are offsets of characters)
        codes = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
        first = max(after, _CHUNK_WINDOW)
        spaces = np.flatnonzero(codes[first:-1] == 32) + first
        nxt = codes[spaces + 1]
        splits = spaces[(codes[spaces - 1] > 32) & (((nxt | 32) - 97).astype(np.uint8) < 26)]
        window = np.zeros(len(splits), np.uint64)
        for back in range(1, _CHUNK_WINDOW + 1):  # the 8 characters before, as one word
            window = (window << np.uint64(8)) | codes[splits - back]
        hashes = (window * _CHUNK_MULTIPLIER) >> _CHUNK_BITS
        cuts: list[int] = []
        for pos in splits[hashes == 0].tolist():
            # chunks of at least MIN_CACHED_CHARS (a repeated phrase must not cut a text to
            # shreds): a cut too close to the last is skipped, and two cuttings of one text
            # from different starts fall into step at the next cut far enough from both
            if (not cuts or pos - cuts[-1] >= MIN_CACHED_CHARS) and split(text, pos):
                cuts.append(pos)
        return cuts

    def _store(
        self,
        probe: tuple[bool, str],
        entry: _Entry,
        superseded: _Entry | None,
        *,
        on_probation: bool = False,
    ) -> None:
        """Keep `entry`; past `max_entries` or `max_tokens`, forget the least recently stored
        entries (the newest stays, however long), whichever family of prompts (first
        characters) they belong to. (Taking the oldest entry of the least recently used family
        instead emptied families that were in use: eight workflows' agents, interleaved, each
        lost their context's encoding every few requests and were tokenized whole.)

        `on_probation`: a chunk no text has used yet. Such chunks hold at most a quarter of the
        cache, the oldest forgotten first, so unique prompts (a trace's conversations) cannot
        push out the encodings that come back; a chunk found again is kept anew, off it."""
        if superseded is not None and id(superseded) in self._order:
            self._forget(superseded)  # the new text extends it: keep the longer one
        self._families.setdefault(probe, _Family()).add(entry)
        self._order[id(entry)] = (probe, entry)
        self._tokens += len(entry.ids)
        if on_probation:
            self._probation[id(entry)] = entry
            self._probation_tokens += len(entry.ids)
            while len(self._probation) > 1 and (
                len(self._probation) > self.max_entries // 4
                or self._probation_tokens > self.max_tokens // 4
            ):
                self._forget(next(iter(self._probation.values())))
        while len(self._order) > 1 and (
            len(self._order) > self.max_entries or self._tokens > self.max_tokens
        ):
            self._forget(next(iter(self._order.values()))[1])

    def _forget(self, entry: _Entry) -> None:
        probe, _ = self._order.pop(id(entry))
        family = self._families[probe]
        family.remove(entry)
        self._tokens -= len(entry.ids)
        if self._probation.pop(id(entry), None) is not None:
            self._probation_tokens -= len(entry.ids)
        if not family.entries:
            del self._families[probe]


_MAX_SPLIT_SEARCH = 4096  # characters searched for a split before a text is encoded whole


def _split_from(text: str, pos: int, split: SplitRule) -> int | None:
    """The first position at or after `pos` where `split` cuts `text` (None: none soon)."""
    last = min(len(text) - 1, pos + _MAX_SPLIT_SEARCH)
    for at in range(max(pos, 1), last):
        if split(text, at):
            return at
    return None


def _extended(best: _Entry | None, common: int) -> _Entry | None:
    """`best` when a new text extends all of it (then the new one replaces it), else None."""
    return best if best is not None and common == len(best.text) else None


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix of two strings: a binary search on C-speed comparisons,
    each comparing only the window not yet known to match (prompts are 100 kB: copying both
    prefixes at every step cost more than the search)."""
    if a.startswith(b):
        return len(b)
    if b.startswith(a):
        return len(a)
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.startswith(a[lo:mid], lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _safe_cut(
    entry: _Entry, text: str, common: int, safe_split: SplitRule
) -> tuple[int, int] | None:
    """(tokens to keep, char position) of the last safe split inside the common prefix."""
    # the split's next character must lie in the common prefix too, and the cached text must
    # continue past the split (its tokens there were not shaped by the text's end)
    k = int(entry.starts.searchsorted(common - 2, side="right"))
    low = max(0, k - _MAX_BACKOFF_TOKENS - 1)
    starts = entry.starts[low:k].tolist()  # the few candidates, as plain ints
    for _ in range(min(k, _MAX_BACKOFF_TOKENS)):
        k -= 1
        if k <= 0:
            return None
        pos = starts[k - low]
        if starts[k - 1 - low] < pos and safe_split(text, pos):
            return k, pos
    return None
