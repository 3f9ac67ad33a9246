"""Chained block keys computed from token ids, the router's own names for KV blocks.

An engine names a block by a hash that depends on its PYTHONHASHSEED and hash algorithm, so the
router cannot recompute it. It computes its own key instead: block i's key depends on block i's
token ids and on block i-1's key. The same key therefore means the same tokens *and* everything
before them, exactly the condition under which an engine can reuse the block. A request's
cache_salt is mixed into the chain's start, as vLLM does, so tenants with different salts never
share a key. Keys depend on the block size: an engine with 16-token blocks and one with 128 have
different keys.

Every request's prompt is keyed (thousands of blocks a second on agentic traffic), so the keys
are computed in numpy, not block by block in Python: each token is mixed with its position in
its block (splitmix64's finaliser), a block's hash is the mix of the sum of its tokens' mixes,
and the chain is a polynomial over the blocks' hashes modulo 2**64,
``key[i] = key[i-1] * P + hash[i]``, which numpy evaluates for all blocks at once as
``P**i * cumsum(hash[j] * P**-j)`` (P is odd, so invertible modulo 2**64). Not a cryptographic
hash: a collision can only mislead routing (the engine checks its own hashes), and salts are
HMACs a client cannot choose.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

BlockKey = int

_ROOT = b"hiveroute-kv-v2"
_MASK = (1 << 64) - 1
_P = 0x9E3779B97F4A7C15  # odd: invertible modulo 2**64
_P_INV = pow(_P, -1, 1 << 64)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_powers: dict[bool, np.ndarray] = {}  # P**i and P**-i for i < len, grown on demand
_position_mixes: dict[int, np.ndarray] = {}  # block size -> each position's constant
_SHORT_CHAIN = 64  # blocks chained in plain Python ints rather than numpy


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping multiplication)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _positions(block_size: int) -> np.ndarray:
    """What each token is mixed with for its position in its block (one array per size)."""
    found = _position_mixes.get(block_size)
    if found is None:
        positions = np.arange(1, block_size + 1, dtype=np.uint64)
        found = _position_mixes[block_size] = positions * _GOLDEN + np.uint64(block_size)
    return found


def _power_table(inverse: bool, count: int) -> np.ndarray:
    table = _powers.get(inverse)
    if table is None or len(table) < count + 1:
        size = max(count + 1, 2 * len(table) if table is not None else 1024)
        base = _P_INV if inverse else _P
        values = [1] * size
        for i in range(1, size):
            values[i] = values[i - 1] * base & _MASK
        table = _powers[inverse] = np.array(values, dtype=np.uint64)
    return table[: count + 1]


def root_key(salt: str | None = None) -> int:
    """The chain's starting point: a constant, or the salt's hash when the request has one."""
    digest = hashlib.blake2b((salt or "").encode(), digest_size=8, key=_ROOT).digest()
    return int.from_bytes(digest, "big")


_PLAIN_ROOT = root_key(None)


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
    n = count * block_size
    # fromiter reads a list of ints a fifth faster than asarray (a 7,000-token prompt: 90 us)
    tokens = np.fromiter(token_ids[:n], dtype=np.int64, count=n).astype(np.uint64)
    blocks = tokens.reshape(count, block_size)
    hashes = _mix(_mix(blocks ^ _positions(block_size)).sum(axis=1, dtype=np.uint64))
    start = parent if parent is not None else (root_key(salt) if salt else _PLAIN_ROOT)
    if count <= _SHORT_CHAIN:
        # an engine's KV event stores a few blocks at a time: chained in plain ints, the same
        # polynomial, without the power tables' fixed cost
        keys_out: list[BlockKey] = []
        key = start
        for h in hashes.tolist():
            key = (key * _P + h) & _MASK
            keys_out.append(key)
        return keys_out
    up, down = _power_table(False, count), _power_table(True, count)
    # key[i] = start * P**(i+1) + sum_{j<=i} hash[j] * P**(i-j)
    keys = up[:count] * np.cumsum(hashes * down[:count], dtype=np.uint64)
    keys = keys + np.uint64(start) * up[1 : count + 1]
    result: list[BlockKey] = keys.tolist()
    return result
