"""The global KV index: events, removals, tiers, LRU cap, speculation, attribution."""

import random
from itertools import takewhile

from hiveroute.kvindex.blocks import block_keys
from hiveroute.kvindex.events import AllBlocksCleared, BlockRemoved, BlockStored
from hiveroute.kvindex.index import KvIndex

BS = 4


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stored(
    hashes: list[int], tokens: list[int], parent: int | None = None, medium: str = "GPU"
) -> BlockStored:
    return BlockStored(hashes, parent, tokens, BS, medium)


def test_stored_blocks_match_by_tokens_whatever_the_engine_hashes() -> None:
    index = KvIndex()
    tokens = list(range(12))
    index.apply("e1", stored([101, 102], tokens[:8]))
    index.apply("e1", stored([103], tokens[8:12], parent=102))
    index.apply("e2", stored([900], tokens[:4]))  # another engine, another hash seed
    assert index.match_tokens("e1", tokens).tokens == 12
    assert index.match_tokens("e2", tokens).tokens == 4
    assert index.match_tokens("e1", [*tokens[:4], 77, 78, 79, 80]).tokens == 4
    assert index.engine_hashes("e1") == {101, 102, 103}
    assert index.holders(block_keys(tokens, BS)[0]) == {"e1": {"GPU"}, "e2": {"GPU"}}


def test_unknown_parent_is_an_orphan_not_a_wrong_key() -> None:
    index = KvIndex()
    index.apply("e1", stored([5], list(range(4)), parent=12345))
    assert index.engine_hashes("e1") == set() and index.orphans("e1") == 1


def test_removal_and_all_blocks_cleared() -> None:
    index = KvIndex()
    tokens = list(range(12))
    index.apply("e1", stored([1, 2, 3], tokens))
    index.apply("e2", stored([7, 8, 9], tokens))
    index.apply("e1", BlockRemoved([2]))
    assert index.match_tokens("e1", tokens).tokens == 4  # a hole ends the prefix
    assert index.engine_hashes("e1") == {1, 3}
    index.apply("e1", BlockRemoved([424242]))  # unknown hashes are ignored
    index.apply("e1", AllBlocksCleared())
    assert index.engine_hashes("e1") == set()
    assert index.match_tokens("e2", tokens).tokens == 12
    index.apply("e2", AllBlocksCleared())
    assert len(index) == 0


def test_lower_tier_counts_as_cached_at_a_cost() -> None:
    index = KvIndex()
    tokens = list(range(12))
    index.apply("e1", stored([1, 2, 3], tokens))
    index.apply("e1", stored([2, 3], tokens[4:], parent=1, medium="CPU"))  # offloaded copy
    index.apply("e1", BlockRemoved([2, 3], "GPU"))  # evicted from the GPU, still on the CPU
    match = index.match_tokens("e1", tokens)
    assert (match.gpu_tokens, match.lower_tokens, match.tokens) == (4, 8, 12)
    index.apply("e1", BlockRemoved([3], "CPU"))
    assert index.match_tokens("e1", tokens).tokens == 8
    assert index.engine_hashes("e1") == {1, 2}


def test_capacity_counts_gpu_blocks_and_evictions_that_a_lower_tier_keeps() -> None:
    """The cache's size shows once it has evicted: the most blocks it held on the GPU. A block
    offloaded to the CPU before its eviction is still an eviction, and not a GPU block."""
    index = KvIndex()
    tokens = list(range(12))
    index.apply("e1", stored([1, 2, 3], tokens))
    index.apply("e1", stored([2, 3], tokens[4:], parent=1, medium="CPU"))
    assert index.capacity_blocks("e1") is None  # it never had to evict
    index.apply("e1", BlockRemoved([2, 3], "GPU"))
    assert index.capacity_blocks("e1") == 3
    index.apply("e1", stored([4, 5], list(range(100, 108))))  # 3 on the GPU, 2 more on the CPU
    assert index.capacity_blocks("e1") == 3


def test_an_engine_removed_leaves_nothing_behind_and_comes_back_empty() -> None:
    """A pool that churns (Kubernetes discovery) must not grow the index's per-engine records,
    and an engine back under a removed one's name holds nothing, memo or not."""
    index = KvIndex()
    tokens = list(range(16))
    keys = block_keys(tokens, BS)
    index.apply("e1", stored([1, 2, 3, 4], tokens))
    index.apply("e1", BlockRemoved([4]))
    assert index.match("e1", keys, BS, shared_blocks=3).blocks == 3  # memoised
    index.remove_engine("e1")
    records = [index._versions, index._losses, index._speculation_evicted_at]
    memos = [index._matched, index._refreshed]
    assert not any("e1" in r for r in records)
    assert not any(key[0] == "e1" for memo in memos for key in memo)
    index.set_block_size("e1", BS)  # back, its cache empty
    assert index.match("e1", keys, BS, shared_blocks=3).blocks == 0


def test_lru_cap_evicts_the_least_recently_used_and_counts_it() -> None:
    index = KvIndex(max_blocks=4)
    a, b = list(range(8)), list(range(100, 108))
    index.apply("e1", stored([1, 2], a))
    index.apply("e1", stored([3, 4], b))
    index.match_tokens("e1", b)  # a lookup alone does not refresh b
    index.add_speculative("e1", block_keys(a, BS))  # a routed there again: more recent than b
    index.apply("e1", stored([5], list(range(200, 204))))
    assert len(index) == 4 and index.evictions == 1
    assert index.match_tokens("e1", b).tokens == 0  # b's first block went: b has no prefix
    assert index.match_tokens("e1", a).tokens == 8
    assert 3 not in index.engine_hashes("e1")  # the engine's hash map forgets it too


def test_speculative_entries_count_until_confirmed_or_expired() -> None:
    clock = Clock()
    index = KvIndex(speculative_ttl_s=2.0, clock=clock)
    index.set_block_size("e1", BS)
    tokens = list(range(8))
    keys = block_keys(tokens, BS)
    index.add_speculative("e1", keys)
    match = index.match_tokens("e1", tokens)
    assert match.tokens == 8 and match.speculative_blocks == 2
    clock.now += 1.0
    index.apply("e1", stored([1], tokens[:4]))  # the engine confirms the first block
    clock.now += 1.5  # the TTL has passed for the unconfirmed block
    match = index.match_tokens("e1", tokens)
    assert match.tokens == 4 and match.speculative_blocks == 0
    index.add_speculative("e2", keys)  # sweeping: expired entries leave the index
    clock.now += 5
    index.add_speculative("e3", [])
    index.add_speculative("e3", block_keys([9, 9, 9, 9], BS))
    assert index.holders(keys[0]) == {"e1": {"GPU"}}
    assert len(index) == 2  # keys[0] (confirmed) and the new e3 block


def test_refreshed_speculation_lives_to_its_last_refresh_then_leaves() -> None:
    clock = Clock()
    index = KvIndex(speculative_ttl_s=2.0, clock=clock)
    index.set_block_size("e1", BS)
    tokens = list(range(8))
    keys = block_keys(tokens, BS)
    for _ in range(4):  # siblings resend the prefix every second: it stays speculated
        index.add_speculative("e1", keys)
        clock.now += 1.0
        index.add_speculative("e2", [])  # a sweep
        assert index.match_tokens("e1", tokens).speculative_blocks == 2
    clock.now += 1.5  # two seconds after the last refresh
    index.add_speculative("e2", block_keys([7, 7, 7, 7], BS))  # a sweep
    assert index.match_tokens("e1", tokens).tokens == 0
    assert len(index) == 1  # only e2's block: the expired ones left the index


def test_speculation_over_the_queue_bound_is_forgotten_not_kept_forever() -> None:
    clock = Clock()
    index = KvIndex(max_blocks=2, speculative_ttl_s=60.0, clock=clock)
    index.set_block_size("e1", BS)
    for i in range(12):  # more expiry records than 4 x max_blocks
        index.add_speculative("e1", block_keys([i] * BS, BS))
    assert len(index) <= 2


def test_salted_requests_never_share_keys() -> None:
    index = KvIndex()
    tokens = list(range(8))
    salted = BlockStored([1, 2], None, tokens, BS, "GPU", None, [["tenant-a"], None])
    index.apply("e1", salted)
    assert index.match_tokens("e1", tokens).tokens == 0
    assert index.match_tokens("e1", tokens, salt="tenant-b").tokens == 0
    assert index.match_tokens("e1", tokens, salt="tenant-a").tokens == 8


def test_block_size_change_means_a_new_engine() -> None:
    index = KvIndex()
    index.apply("e1", stored([1], list(range(4))))
    index.apply("e1", BlockStored([2], None, list(range(16)), 16))
    assert index.block_size("e1") == 16 and index.engine_hashes("e1") == {2}
    index.remove_engine("e1")
    assert index.engines() == [] and len(index) == 0


def test_requests_routed_before_the_first_event_still_count() -> None:
    clock = Clock()
    index = KvIndex(clock=clock)
    tokens = list(range(8))
    other = list(range(50, 58))
    index.add_speculative_tokens("e1", tokens)
    index.add_speculative_tokens("e1", other, ttl_s=1)
    clock.now += 2  # the second one expired before the size was known
    index.apply("e1", stored([1], tokens[:4]))  # the first event: the block size is 4
    assert index.match("e1", block_keys(tokens, BS), BS).blocks == 2  # one stored, one pending
    assert index.match("e1", block_keys(other, BS), BS).blocks == 0


def test_a_prefix_speculated_lately_is_not_speculated_again_for_each_request() -> None:
    """A workflow resends its context with every request: the blocks it shares with an earlier
    prompt are speculated once per half TTL on an engine, only its new blocks every time."""
    clock = Clock()
    index = KvIndex(speculative_ttl_s=2.0, clock=clock)
    index.set_block_size("e1", BS)
    first = block_keys(list(range(8)), BS)  # 2 blocks
    longer = block_keys(list(range(12)), BS)  # the same 2, and 1 more
    index.add_speculative("e1", first)
    clock.now += 0.5  # within half the TTL: the shared 2 keep their expiry (2.0)
    index.add_speculative("e1", longer, shared_blocks=2)
    clock.now += 1.6  # 2.1 s: the shared blocks' speculation has lapsed, the new one's not
    assert index.match("e1", longer, BS).gpu_blocks == 0
    index.add_speculative("e1", first)  # at 2.1, until 4.1
    clock.now += 1.2  # 3.3: past half the TTL, the shared blocks are speculated again too
    index.add_speculative("e1", longer, shared_blocks=2)
    clock.now += 1.2  # 4.5: past the first expiry, within the refreshed one (5.3)
    assert index.match("e1", longer, BS).speculative_blocks == 3


def test_a_confirmed_prefix_refreshed_lately_is_respeculated_once_the_engine_lost_a_block() -> None:
    """A workflow's context, confirmed by events, is refreshed once per half TTL, not for each
    of its requests; but once the engine removes one of its blocks, the next request that
    sends the context speculates that block again (the engine will store it again)."""
    clock = Clock()
    index = KvIndex(speculative_ttl_s=2.0, clock=clock)
    context = list(range(16))  # 4 blocks
    index.apply("e1", BlockStored([11, 12, 13, 14], None, context, BS))
    first = block_keys([*context, *range(50, 58)], BS)  # the context and 2 blocks of its own
    second = block_keys([*context, *range(60, 68)], BS)
    index.add_speculative("e1", first, shared_blocks=4)
    clock.now += 0.25
    index.add_speculative("e1", second, shared_blocks=4)  # within half a TTL: its tail only
    assert index.match("e1", second, BS).gpu_blocks == 6
    index.apply("e1", BlockRemoved([12]))  # the engine evicted the context's second block
    assert index.match("e1", second, BS).gpu_blocks == 1
    clock.now += 0.25  # still within half a TTL of the refresh
    third = block_keys([*context, *range(70, 78)], BS)
    index.add_speculative("e1", third, shared_blocks=4)
    found = index.match("e1", third, BS)
    assert (found.gpu_blocks, found.speculative_blocks) == (6, 3)  # block 2 and its own two


def confirmed_on_gpu(index: KvIndex, engine: str, keys: list[int]) -> int:
    """How many leading keys the engine's events put on its GPU, key by key (`holders`)."""
    return len(list(takewhile(lambda key: "GPU" in index.holders(key).get(engine, ()), keys)))


def test_a_remembered_prefix_match_equals_a_full_walk_whatever_happens_between() -> None:
    """Matching a shared prefix once per prefix must never change an answer: random stores,
    removals on any tier, speculation, expiry, clears and index evictions between matches,
    and every match with the shared-prefix hint equals the same match without it, and counts
    exactly the blocks `holders` reports on the GPU when none of it is speculative or lower."""
    rng = random.Random(7)
    clock = Clock()
    index = KvIndex(max_blocks=60, speculative_ttl_s=2.0, clock=clock)
    prompts = [list(range(p * 1000, p * 1000 + 40)) for p in range(3)]  # 10 blocks each
    hashes: dict[tuple[str, int, int], int] = {}
    for engine in ("e1", "e2"):
        index.set_block_size(engine, BS)
    for _ in range(3000):
        engine = rng.choice(("e1", "e2"))
        p = rng.randrange(3)
        tokens = prompts[p][: BS * rng.randint(1, 10)]
        keys = block_keys(tokens, BS)
        op = rng.random()
        if op < 0.25:
            n = len(keys)
            ids = [hashes.setdefault((engine, p, i), rng.getrandbits(40)) for i in range(n)]
            medium = rng.choice(("GPU", "GPU", "CPU"))
            index.apply(engine, BlockStored(ids, None, tokens, BS, medium=medium))
        elif op < 0.35:
            i = rng.randrange(len(keys))
            index.block_removed(engine, [hashes.get((engine, p, i), 0)], rng.choice(("GPU", "CPU")))
        elif op < 0.5:
            index.add_speculative(engine, keys, shared_blocks=rng.randint(0, len(keys)))
        elif op < 0.52:
            index.clear_engine(engine)
        elif op < 0.6:
            clock.now += rng.choice((0.3, 1.1, 2.5))
        else:
            shared = rng.randint(1, len(keys))
            found = index.match(engine, keys, BS)
            assert index.match(engine, keys, BS, shared_blocks=shared) == found
            # the match counts exactly the blocks confirmed on the GPU when nothing in it is speculative or on a lower tier
            confirmed = confirmed_on_gpu(index, engine, keys)
            assert found.gpu_blocks >= confirmed
            if found.speculative_blocks == 0 and found.lower_blocks == 0:
                assert found.gpu_blocks == confirmed
    assert index.match_memo_hits >= 50  # the remembered matches were used, not only stored


def test_a_speculated_prompt_counts_whole_until_its_ttl_whatever_its_tail_held() -> None:
    """A new tail is added in bulk when the index knows none of it, key by key when it knows
    some key further on (the LRU cap evicted a parent before its child; another engine holds
    the prompt): either way every key counts as speculated on the engine right after, and once
    the TTL passes nothing speculative stays in the index."""
    rng = random.Random(11)
    clock = Clock()
    index = KvIndex(max_blocks=30, speculative_ttl_s=2.0, clock=clock)
    for engine in ("e1", "e2"):
        index.set_block_size(engine, BS)
    prompts = [list(range(p * 1000, p * 1000 + 48)) for p in range(4)]  # 12 blocks each
    for _ in range(2000):
        engine, other = rng.sample(("e1", "e2"), 2)
        tokens = rng.choice(prompts)[: BS * rng.randint(1, 12)]
        keys = block_keys(tokens, BS)
        if rng.random() < 0.3:
            index.add_speculative(other, keys)
        index.add_speculative(engine, keys)
        match = index.match(engine, keys, BS)
        assert match.gpu_blocks == len(keys), (match, len(keys))
        assert len(index) <= 30
        clock.now += rng.choice((0.0, 0.1, 0.5))
    clock.now += 3.0
    index.add_speculative("e1", block_keys([7] * BS, BS))  # a sweep
    assert len(index) == 1  # nothing confirmed: every block speculated before expired and left


def test_a_prefix_whose_head_the_cap_evicted_is_speculated_again_though_lately_speculated() -> None:
    """The half-TTL shortcut trusts that a prefix speculated lately is there whole. The index's
    own cap evicts the oldest blocks first, a speculated prompt's head before its end: then a
    sibling sharing that prefix must speculate the head again, or the engine looks empty."""
    clock = Clock()
    index = KvIndex(max_blocks=16, speculative_ttl_s=10.0, clock=clock)
    index.set_block_size("e1", BS)
    context = list(range(48))  # 12 blocks every sibling shares
    keys = block_keys(context, BS)
    index.add_speculative("e1", keys)
    index.add_speculative("e1", block_keys([7] * (6 * BS), BS))  # the cap evicts the head
    assert index.match("e1", keys, BS).gpu_blocks < len(keys)
    clock.now += 1.0
    sibling = block_keys([*context, 90, 91, 92, 93], BS)
    index.add_speculative("e1", sibling, shared_blocks=len(keys))
    assert index.match("e1", sibling, BS).gpu_blocks == len(sibling)
