"""The block pool and cache manager behave like vLLM v1's."""

from __future__ import annotations

from hiveroute.sim.kv_cache import BlockPool, CacheRequest, KVCacheManager, hash_block


def _manager(num_blocks: int = 9, block_size: int = 4) -> KVCacheManager:
    return KVCacheManager(BlockPool(num_blocks, block_size))


def _admit(manager: KVCacheManager, tokens: list[int], salt: str | None = None) -> CacheRequest:
    request = CacheRequest(list(tokens), salt)
    hits, hit_tokens = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, 0, len(tokens) - hit_tokens, hits)
    return request


def test_full_blocks_are_stored_with_chained_hashes_and_token_ids() -> None:
    manager = _manager()
    request = _admit(manager, list(range(10)))  # 2 full blocks of 4, 2 tokens left over
    (event,) = manager.pool.take_events()
    assert event["type"] == "BlockStored"
    assert event["token_ids"] == list(range(8))
    assert event["parent_block_hash"] is None
    first = hash_block(None, [0, 1, 2, 3], None)
    assert event["block_hashes"] == [first, hash_block(first, [4, 5, 6, 7], None)]
    assert event["extra_keys"] == [None, None]
    assert len(request.blocks) == 3  # the partial third block is allocated, not cached


def test_prefix_hit_stops_before_the_last_token() -> None:
    manager = _manager()
    first = _admit(manager, list(range(8)))
    manager.free(first)
    again = CacheRequest(list(range(8)), None)
    # The whole prompt is cached, but the last token must be computed: the hit is one block.
    assert manager.get_computed_blocks(again)[1] == 4
    longer = CacheRequest(list(range(9)), None)
    assert manager.get_computed_blocks(longer)[1] == 8


def test_cache_salt_changes_the_first_hash_only_and_is_published() -> None:
    manager = _manager()
    plain = _admit(manager, list(range(9)))
    salted = _admit(manager, list(range(9)), salt="tenant-a")
    events = manager.pool.take_events()
    assert plain.block_hashes[0] != salted.block_hashes[0]
    assert events[1]["extra_keys"] == [["tenant-a"], None]
    probe = CacheRequest(list(range(9)), "tenant-b")
    assert manager.get_computed_blocks(probe)[1] == 0  # another tenant shares nothing
    assert manager.get_computed_blocks(CacheRequest(list(range(9)), "tenant-a"))[1] == 8


def test_lru_eviction_takes_the_least_recent_tail_block_first() -> None:
    manager = _manager(num_blocks=5, block_size=4)  # 4 usable blocks
    a = _admit(manager, [*list(range(100, 108)), 1])  # blocks a0 a1 + partial
    manager.free(a)
    b = _admit(manager, [*list(range(200, 204)), 2])  # b0 + partial: uses 2 more blocks
    manager.free(b)
    manager.pool.take_events()
    c = _admit(manager, list(range(300, 307)))  # needs 2 blocks: evicts the LRU cached ones
    events = manager.pool.take_events()
    removed = [e["block_hashes"][0] for e in events if e["type"] == "BlockRemoved"]
    # Freed tail first: a's partial block (no hash) went to the front of the free queue, a1
    # then a0 to the back; b likewise. The queue is now [b-partial, a1, a0, b0]: c takes the
    # hashless block, then evicts a1, the least recently used cached block.
    assert removed == [a.block_hashes[1]]
    manager.free(c)
    d = _admit(manager, list(range(400, 416)))  # 4 blocks: evicts every cached block, LRU first
    events = manager.pool.take_events()
    removed = [e["block_hashes"][0] for e in events if e["type"] == "BlockRemoved"]
    assert removed == [a.block_hashes[0], b.block_hashes[0], c.block_hashes[0]]
    assert len(d.blocks) == 4


def test_ref_counts_keep_shared_blocks_out_of_the_free_queue() -> None:
    manager = _manager()
    a = _admit(manager, list(range(9)))
    b = _admit(manager, list(range(9)))  # shares a's two full blocks
    assert b.blocks[:2] == a.blocks[:2]
    assert a.blocks[0].ref_cnt == 2
    manager.free(a)
    assert b.blocks[0].ref_cnt == 1
    assert b.blocks[0].block_id not in manager.pool.free
    manager.free(b)
    assert manager.pool.num_free == manager.pool.num_blocks - 1


def test_allocation_fails_cleanly_when_the_pool_is_full() -> None:
    manager = _manager(num_blocks=3, block_size=4)  # 2 usable blocks
    request = CacheRequest(list(range(12)), None)
    assert not manager.allocate_slots(request, 0, 12)
    assert request.blocks == [] and manager.pool.num_free == 2


def test_reset_clears_everything_and_says_so() -> None:
    manager = _manager()
    manager.free(_admit(manager, list(range(9))))
    manager.pool.take_events()
    assert manager.pool.reset()
    assert manager.pool.take_events() == [{"type": "AllBlocksCleared"}]
    assert manager.get_computed_blocks(CacheRequest(list(range(9)), None))[1] == 0
