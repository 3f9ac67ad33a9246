"""Chained block keys computed from token ids, the router's own names for KV blocks.

An engine names a block by a hash that depends on its PYTHONHASHSEED and hash algorithm, so the
router cannot recompute it. It computes its own key instead: block i's key depends on block i's
token ids and on block i-1's key. The same key therefore means the same tokens *and* everything
before them, exactly the condition under which an engine can reuse the block. A request's
cache_salt is mixed into the chain's start, as vLLM does, so tenants with different salts never
share a key. Keys depend on the block size: an engine with 16-token blocks and one with 128 have
different keys.

Block i's key is XXH3-64 of its token ids (as unsigned 64-bit integers) seeded with block i-1's
key: one C call per block. Keys are computed for every request's prompt and for every block in
the engines' KV events (thousands of blocks a second, a few at a time): on an event's one to
twenty blocks this costs a fifth to a fourteenth of the vectorised numpy hash it replaced, whose
dozen array operations were a fixed cost per call, and on a 10,000-token prompt two fifths
(benchmarks/results/block_keys.md). Not a cryptographic hash: a collision can only mislead
routing (the engine checks its own hashes). Under API keys a tenant's salt is an HMAC the
router sets (gateway/auth.py); without them a client's own cache_salt is used as sent, and a
client that crafted a collision would only misroute its own requests.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

import xxhash

BlockKey = int

_ROOT = b"hiveroute-kv-v3"
_TOKEN_BYTES = 8  # token ids as unsigned 64-bit integers (array type "Q": read 3x faster than "q")
MAX_TOKEN_ID = (1 << 64) - 1


def root_key(salt: str | None = None) -> int:
    """The chain's starting point: a constant, or the salt's hash when the request has one."""
    digest = hashlib.blake2b((salt or "").encode(), digest_size=8, key=_ROOT).digest()
    return int.from_bytes(digest, "big")


_PLAIN_ROOT = root_key(None)


def keyable(token_ids: Sequence[int]) -> bool:
    """Whether every token id is one `block_keys` can key (0 to `MAX_TOKEN_ID`)."""
    return not token_ids or (min(token_ids) >= 0 and max(token_ids) <= MAX_TOKEN_ID)


def block_keys(
    token_ids: Sequence[int], block_size: int, *, salt: str | None = None, parent: int | None = None
) -> list[BlockKey]:
    """Keys of every *full* block of `token_ids` (a partial last block is never cached).

    `parent` continues a chain (the key of the block before `token_ids[0]`); otherwise the chain
    starts at the root, with `salt` mixed in. A token id that is not `keyable` raises OverflowError
    (requests and events are checked before they get here).
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    count = len(token_ids) // block_size
    if count == 0:
        return []
    data = array("Q", token_ids[: count * block_size]).tobytes()
    step = block_size * _TOKEN_BYTES
    key = parent if parent is not None else (root_key(salt) if salt else _PLAIN_ROOT)
    keys: list[BlockKey] = []
    append, digest = keys.append, xxhash.xxh3_64_intdigest
    for start in range(0, count * step, step):
        key = digest(data[start : start + step], key)
        append(key)
    return keys
