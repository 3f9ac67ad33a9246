"""A paged KV cache like vLLM v1's: the block pool (bookkeeping) and the manager (policy).

`BlockPool` owns the blocks, as vLLM's `block_pool.py` does: the free queue in eviction order
(LRU, evictable cached blocks included), the map from block hash to block, reference counts,
and the KV events, built at the exact point where a block is cached or evicted.
`KVCacheManager` decides what a request gets: its prefix-cache hit and its new slots.

Faithful details (vLLM 0.32): block 0 is a null block that is never handed out; a request whose
whole prompt is cached still recomputes its last token (so the hit stops at the last full block
before it); blocks are cached when they are scheduled full (prompt and output alike); a request's
blocks are freed tail first, so its last blocks are evicted first; a freed block without a hash
goes to the front of the free queue, a cached one to the back.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

MASK64 = (1 << 64) - 1
NONE_HASH = int.from_bytes(hashlib.blake2b(b"hiveroute-sim-none-hash", digest_size=8).digest())


def hash_block(parent: int | None, tokens: Sequence[int], salt: str | None) -> int:
    """Chained block hash: parent hash, the block's token ids, and the salt (first block only).

    Published as a 64-bit integer, as vLLM does by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).
    """
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack(">Q", NONE_HASH if parent is None else parent))
    h.update((tokens if isinstance(tokens, array) else array("q", tokens)).tobytes())
    if salt:
        h.update(b"\x00salt\x00" + salt.encode())
    return int.from_bytes(h.digest())


class Block:
    __slots__ = ("block_hash", "block_id", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None


class CacheRequest:
    """What the cache needs to know about a request: its tokens, salt, hashes and blocks.

    Token ids are kept in an `array`, not a list: hundreds of requests of thousands of tokens
    each are what the garbage collector would otherwise walk through on every pass.
    """

    __slots__ = ("block_hashes", "blocks", "cache_salt", "num_cached_blocks", "token_ids")

    def __init__(self, token_ids: Sequence[int], cache_salt: str | None) -> None:
        # prompt then output; grows as tokens are generated
        self.token_ids: array[int] = array("q", token_ids)
        self.cache_salt = cache_salt or None
        self.block_hashes: list[int] = []
        self.blocks: list[Block] = []
        self.num_cached_blocks = 0

    def hashes_upto(self, num_full_blocks: int, block_size: int) -> list[int]:
        """The chained hashes of the first `num_full_blocks` blocks (computed once each)."""
        hashes = self.block_hashes
        tokens = self.token_ids
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            chunk = tokens[i * block_size : (i + 1) * block_size]
            hashes.append(hash_block(parent, chunk, self.cache_salt if i == 0 else None))
        return hashes


class BlockPool:
    """The blocks, the free queue (LRU order), the hash map, and the events of changes."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_events: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError("a block pool needs at least 2 blocks (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order: the first is handed out (and evicted) first.
        self.free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks[1:])
        # Hash -> the block with it, or, in the rare case of several, {block_id: block}. A plain
        # block needs no dict of its own: a dict per cached hash is what the garbage collector
        # would otherwise walk through, for long pauses, once the cache holds 100k blocks.
        self.cached: dict[int, Block | dict[int, Block]] = {}
        self.enable_events = enable_events
        self.events: list[dict[str, Any]] = []
        self.evictions = 0

    # --- queries ---------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        """Share of usable blocks in use, as vLLM's kv_cache_usage_perc (0..1)."""
        usable = self.num_blocks - 1
        return 1.0 - len(self.free) / usable if usable else 0.0

    def num_cached_blocks(self) -> int:
        return sum(1 if isinstance(v, Block) else len(v) for v in self.cached.values())

    def get_cached(self, block_hash: int) -> Block | None:
        found = self.cached.get(block_hash)
        if found is None or type(found) is Block:
            return found
        return next(iter(found.values()))  # type: ignore[union-attr]

    # --- changes ---------------------------------------------------------------------------

    def get_new_blocks(self, n: int) -> list[Block]:
        if n > len(self.free):
            raise ValueError(f"cannot get {n} free blocks from the pool")
        out = []
        popitem = self.free.popitem
        for _ in range(n):
            _, block = popitem(last=False)
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: Block) -> None:
        block_hash = block.block_hash
        assert block_hash is not None
        cached = self.cached
        same = cached.get(block_hash)
        removed = False
        if same is block:
            del cached[block_hash]
            removed = True
        elif isinstance(same, dict) and same.pop(block.block_id, None) is not None:
            if len(same) == 1:
                cached[block_hash] = next(iter(same.values()))
            removed = True
        if removed:
            self.evictions += 1
            if self.enable_events:
                self.events.append(
                    {
                        "type": "BlockRemoved",
                        "block_hashes": [block_hash],
                        "medium": "GPU",
                        "group_idx": 0,
                    }
                )
        block.block_hash = None

    def touch(self, blocks: Sequence[Block]) -> None:
        """Take a reference on cached blocks (a prefix hit), out of the free queue if there."""
        free = self.free
        for block in blocks:
            if block.ref_cnt == 0:
                del free[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, ordered: Sequence[Block]) -> None:
        """Drop one reference each; blocks reaching 0 join the free queue (hashless first)."""
        first: list[Block] = []
        free = self.free
        for block in ordered:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    first.append(block)
                else:
                    free[block.block_id] = block
        for block in reversed(first):
            free[block.block_id] = block
            free.move_to_end(block.block_id, last=False)

    def cache_full_blocks(self, request: CacheRequest, num_full_blocks: int) -> None:
        """Give the request's newly full blocks their hashes and publish them (BlockStored)."""
        start = request.num_cached_blocks
        if num_full_blocks <= start:
            return
        bs = self.block_size
        hashes = request.hashes_upto(num_full_blocks, bs)
        new_hashes = hashes[start:num_full_blocks]
        cached = self.cached
        for block, block_hash in zip(
            request.blocks[start:num_full_blocks], new_hashes, strict=True
        ):
            block.block_hash = block_hash
            same = cached.get(block_hash)
            if same is None:
                cached[block_hash] = block
            elif type(same) is Block:
                cached[block_hash] = {same.block_id: same, block.block_id: block}
            else:
                same[block.block_id] = block  # type: ignore[index]
        request.num_cached_blocks = num_full_blocks
        if self.enable_events:
            salt = request.cache_salt
            self.events.append(
                {
                    "type": "BlockStored",
                    "block_hashes": list(new_hashes),
                    "parent_block_hash": hashes[start - 1] if start else None,
                    "token_ids": request.token_ids[start * bs : num_full_blocks * bs].tolist(),
                    "block_size": bs,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [
                        [salt] if (i == 0 and salt) else None for i in range(start, num_full_blocks)
                    ],
                    "group_idx": 0,
                    "kv_cache_spec_kind": "full_attention",
                }
            )

    def reset(self) -> bool:
        """Forget every cached hash (vLLM's reset_prefix_cache); refused while blocks are used."""
        if len(self.free) != self.num_blocks - 1:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        if self.enable_events:
            self.events.append({"type": "AllBlocksCleared"})
        return True

    def take_events(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events


class KVCacheManager:
    """Which blocks a request gets: prefix hits on chained hashes, then new blocks."""

    def __init__(self, pool: BlockPool, *, enable_caching: bool = True) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.enable_caching = enable_caching

    def get_computed_blocks(self, request: CacheRequest) -> tuple[list[Block], int]:
        """The longest cached prefix, in whole blocks, leaving the last token to compute."""
        if not self.enable_caching:
            return [], 0
        bs = self.block_size
        max_hit_tokens = len(request.token_ids) - 1
        hashes = request.hashes_upto(max_hit_tokens // bs, bs)
        hits: list[Block] = []
        get = self.pool.get_cached
        for block_hash in hashes[: max_hit_tokens // bs]:
            block = get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * bs

    def allocate_slots(
        self,
        request: CacheRequest,
        num_computed_tokens: int,
        num_new_tokens: int,
        new_computed_blocks: Sequence[Block] = (),
    ) -> bool:
        """Room for `num_new_tokens` more; False (nothing changed) if the pool cannot give it."""
        pool = self.pool
        bs = self.block_size
        total = num_computed_tokens + len(new_computed_blocks) * bs + num_new_tokens
        need = -(-total // bs) - len(request.blocks) - len(new_computed_blocks)
        evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if need > pool.num_free - evictable_hits:
            return False
        if new_computed_blocks:
            pool.touch(new_computed_blocks)
            request.blocks.extend(new_computed_blocks)
            request.num_cached_blocks = len(request.blocks)
        if need > 0:
            request.blocks.extend(pool.get_new_blocks(need))
        if self.enable_caching:
            cacheable = min(total, len(request.token_ids)) // bs
            pool.cache_full_blocks(request, cacheable)
        return True

    def free(self, request: CacheRequest) -> None:
        """Release the request's blocks, tail first (its last blocks are evicted first)."""
        blocks = request.blocks
        if blocks:
            blocks.reverse()
            self.pool.free_blocks(blocks)
        request.blocks = []
        request.num_cached_blocks = 0
