"""Chained block keys."""

import random

import pytest

from hiveroute.kvindex.blocks import MAX_TOKEN_ID, block_keys, keyable

KEY_1234 = 0x7AD8FA4596974B52  # XXH3-64 of the block, seeded with the plain root


def test_keys_chain_and_ignore_a_partial_last_block() -> None:
    tokens = list(range(40))
    keys = block_keys(tokens, 16)
    assert len(keys) == 2
    assert block_keys(tokens[:32], 16) == keys
    assert block_keys(tokens[:16], 16) == keys[:1]
    changed = [*tokens[:5], 999, *tokens[6:]]
    assert block_keys(changed, 16)[1] != keys[1]  # a change in block 0 changes every later key
    assert block_keys(tokens[16:32], 16)[0] != keys[1]  # same tokens, different prefix


def test_parent_continues_a_chain() -> None:
    tokens = list(range(64))
    keys = block_keys(tokens, 16)
    assert block_keys(tokens[32:], 16, parent=keys[1]) == keys[2:]


def test_salt_separates_tenants_and_block_size_matters() -> None:
    tokens = list(range(64))
    plain, a, b = (block_keys(tokens, 16, salt=s) for s in (None, "a", "b"))
    assert len({plain[0], a[0], b[0]}) == 3 and len({plain[3], a[3], b[3]}) == 3
    assert block_keys(tokens, 16, salt="") == plain
    assert block_keys(tokens, 32)[0] != plain[1]


def test_keys_are_stable_across_processes() -> None:
    # a fixed value: keys must not depend on PYTHONHASHSEED, the run or the machine
    assert block_keys([1, 2, 3, 4], 4) == [KEY_1234]


def test_bad_block_size_and_token_ids() -> None:
    with pytest.raises(ValueError):
        block_keys([1, 2], 0)
    for bad in (-1, MAX_TOKEN_ID + 1):
        assert not keyable([1, bad])
        with pytest.raises(OverflowError):
            block_keys([1, bad], 2)
    assert keyable([]) and keyable([0, MAX_TOKEN_ID])
    assert len(block_keys([0, MAX_TOKEN_ID], 2)) == 1  # both ends of the range are keyed


def test_a_prompt_split_anywhere_chains_to_the_same_keys() -> None:
    """Events key a few blocks at a time, continuing from a parent; requests key whole
    prompts: every split of a prompt into a head and a tail continued from the head's last key
    gives the whole prompt's keys."""
    rng = random.Random(5)
    tokens = [rng.randrange(1 << 17) for _ in range(200 * 4)]  # 200 blocks of 4
    whole = block_keys(tokens, 4, salt="t")
    assert len(whole) == 200
    for cut in (1, 2, 63, 64, 65, 100, 136, 137, 199):
        head = block_keys(tokens[: cut * 4], 4, salt="t")
        tail = block_keys(tokens[cut * 4 :], 4, parent=head[-1])
        assert head + tail == whole, cut
