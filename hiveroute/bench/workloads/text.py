"""Deterministic filler text whose size is known in tokens.

Sizes are counted as the built-in tokenizer counts them: every word and every run of spaces is
one token, so ``n`` words each followed by a space are exactly ``2 n`` tokens, and texts built
from such pieces can be concatenated without changing the tokens of what came before. Model
tokenizers (BPE) count differently; sizes are then approximate, equality of prefixes still holds.
"""

from __future__ import annotations

import hashlib
import random

_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u", "y")
_CODAS = ("", "n", "r", "s", "l", "x")
SYLLABLES = tuple(o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS)
VOCAB = tuple(a + b for a in SYLLABLES[::7] for b in SYLLABLES[::5])


def rng_for(*key: object) -> random.Random:
    """A random generator seeded by a stable hash of `key` (independent of PYTHONHASHSEED)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


def filler(n_tokens: int, *key: object) -> str:
    """`n_tokens` tokens of words and spaces, the same for the same key, ending in a space.

    An odd count ends with a word instead of a space (still exactly `n_tokens` tokens).
    """
    if n_tokens <= 0:
        return ""
    rng = rng_for(*key)
    n_words = (n_tokens + 1) // 2
    words = [VOCAB[rng.randrange(len(VOCAB))] for _ in range(n_words)]
    text = " ".join(words)
    return text + " " if n_tokens % 2 == 0 else text


def labelled_filler(label: str, n_tokens: int, *key: object) -> str:
    """Filler that starts with the word `label` (which must be one \\w+ word), so texts with
    different labels differ in their first token."""
    if n_tokens <= 0:
        return ""
    if n_tokens == 1:
        return label
    return label + " " + filler(n_tokens - 2, label, *key)
