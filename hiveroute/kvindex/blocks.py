"""Chained block keys computed from token ids, the router's own names for KV blocks.

An engine names a block by a hash that depends on its PYTHONHASHSEED and hash algorithm, so the
router cannot recompute it. It computes its own key instead: block i's key hashes block i-1's key
with block i's token ids. The same key therefore means the same tokens *and* everything before
them, exactly the condition under which an engine can reuse the block. A request's cache_salt is
mixed into the first block, as vLLM does, so tenants with different salts never share a key.
Keys depend on the block size: an engine with 16-token blocks and one with 128 have different keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

BlockKey = int

_ROOT = b"hiveroute-kv-v1"


def root_key(salt: str | None = None) -> bytes:
    """The chain's starting point: a constant, or the salt's hash when the request has one."""
    if not salt:
        return _ROOT
    return hashlib.blake2b(salt.encode(), digest_size=8, key=_ROOT).digest()


def block_keys(
    token_ids: Sequence[int], block_size: int, *, salt: str | None = None, parent: int | None = None
) -> list[BlockKey]:
    """Keys of every *full* block of `token_ids` (a partial last block is never cached).

    `parent` continues a chain (the key of the block before `token_ids[0]`); otherwise the chain
    starts at the root, with `salt` mixed in.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    count = len(token_ids) // block_size
    if count == 0:
        return []
    data = np.asarray(token_ids[: count * block_size], dtype=np.int64).astype("<u4").tobytes()
    stride = block_size * 4
    prev = parent.to_bytes(8, "big") if parent is not None else root_key(salt)
    keys: list[BlockKey] = []
    blake = hashlib.blake2b
    for i in range(count):
        digest = blake(data[i * stride : (i + 1) * stride], digest_size=8, key=prev).digest()
        keys.append(int.from_bytes(digest, "big"))
        prev = digest
    return keys
