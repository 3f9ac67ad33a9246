"""Decoding vLLM's KV-event messages in both encodings."""

import msgpack
import pytest

from hiveroute.kvindex.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    decode_message,
    encode_message,
)


def _dict_stored(**over: object) -> dict[str, object]:
    event: dict[str, object] = {
        "type": "BlockStored",
        "block_hashes": [11, 12],
        "parent_block_hash": None,
        "token_ids": list(range(8)),
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": None,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    event.update(over)
    return event


def test_dict_encoding_of_vllm_0_32() -> None:
    frames = encode_message(
        7,
        [
            _dict_stored(),
            {"type": "BlockRemoved", "block_hashes": [12], "medium": "CPU", "group_idx": 0},
            {"type": "AllBlocksCleared"},
        ],
    )
    batch = decode_message(frames)
    assert batch.seq == 7 and batch.dp_rank == 0
    stored, removed, cleared = batch.events
    assert stored == BlockStored([11, 12], None, list(range(8)), 4, "GPU", None, None)
    assert removed == BlockRemoved([12], "CPU")
    assert cleared == AllBlocksCleared()


@pytest.mark.parametrize(
    ("array", "medium", "lora"),
    [
        (["BlockStored", [1, 2], 9, list(range(8)), 4, None], "GPU", None),  # before medium
        (["BlockStored", [1, 2], 9, list(range(8)), 4, None, "cpu"], "CPU", None),
        (["BlockStored", [1, 2], 9, list(range(8)), 4, 3, "GPU", "adapter"], "GPU", "adapter"),
    ],
)
def test_array_encoding_of_older_vllm(array: list[object], medium: str, lora: str | None) -> None:
    batch = decode_message(encode_message(0, [array, ["BlockRemoved", [2]], ["AllBlocksCleared"]]))
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [1, 2] and stored.parent_block_hash == 9
    assert stored.token_ids == list(range(8)) and stored.block_size == 4
    assert stored.medium == medium and stored.lora_name == lora
    assert removed == BlockRemoved([2], "GPU")
    assert isinstance(cleared, AllBlocksCleared)


def test_bytes_hashes_and_unknown_event_types() -> None:
    batch = decode_message(
        encode_message(1, [_dict_stored(block_hashes=[b"\x01" * 32]), {"type": "Future"}])
    )
    assert len(batch.events) == 1
    assert batch.events[0].block_hashes == [b"\x01" * 32]  # type: ignore[union-attr]


def test_cache_salt_is_read_from_the_first_blocks_extra_keys() -> None:
    event = decode_message(
        encode_message(0, [_dict_stored(extra_keys=[["tenant-a"], None], lora_name=None)])
    ).events[0]
    assert isinstance(event, BlockStored) and event.cache_salt == "tenant-a"
    with_lora = decode_message(
        encode_message(0, [_dict_stored(extra_keys=[["ad", "salt"], ["ad"]], lora_name="ad")])
    ).events[0]
    assert isinstance(with_lora, BlockStored) and with_lora.cache_salt == "salt"
    only_lora = decode_message(
        encode_message(0, [_dict_stored(extra_keys=[["ad"], ["ad"]], lora_name="ad")])
    ).events[0]
    assert isinstance(only_lora, BlockStored) and only_lora.cache_salt is None
    child = decode_message(
        encode_message(0, [_dict_stored(parent_block_hash=5, extra_keys=[["x"], None])])
    ).events[0]
    assert isinstance(child, BlockStored) and child.cache_salt is None  # salt only at block 0


@pytest.mark.parametrize(
    "frames",
    [
        [b"topic", b"\x00" * 8],
        [b"topic", b"\x00" * 4, msgpack.packb([0.0, [], 0])],
        [b"topic", b"\x00" * 8, b"\xc1"],
        [b"topic", b"\x00" * 8, msgpack.packb({"not": "a batch"})],
        [b"topic", b"\x00" * 8, msgpack.packb([0.0, [42], 0])],
        [b"topic", b"\x00" * 8, msgpack.packb([0.0, [{"type": "BlockStored"}], 0])],
        [b"topic", b"\x00" * 8, msgpack.packb([0.0, [["BlockRemoved", "nope"]], 0])],
        # token ids that are not integers, and a map keyed by a list (unhashable): each raised
        # a TypeError or ValueError that the subscriber took for a broken socket
        *(
            encode_message(0, [_dict_stored(token_ids=[1, 2, 3, 4, 5, 6, 7, bad])])
            for bad in (None, "x", 2.5, float("nan"), float("inf"))
        ),
        [b"topic", b"\x00" * 8, b"\x92\x00\x91\x81\x91\x01\x01"],
    ],
)
def test_malformed_messages_raise_a_decode_error(frames: list[bytes]) -> None:
    with pytest.raises(EventDecodeError):
        decode_message(frames)


def test_fields_of_other_types_are_checked_one_by_one_as_before() -> None:
    """Lists of plain ints (and bytes hashes) pass in one C-level type check; anything else
    takes the element-by-element path: token ids are coerced, a boolean hash is refused."""
    mixed = decode_message(
        encode_message(0, [_dict_stored(token_ids=[1, 2.0, True, 4, 5, 6, 7, 8])])
    ).events[0]
    assert isinstance(mixed, BlockStored)
    assert mixed.token_ids == [1, 2, 1, 4, 5, 6, 7, 8]
    assert all(type(t) is int for t in mixed.token_ids)
    plain = decode_message(encode_message(0, [_dict_stored(block_hashes=[11, b"\x02"])])).events[0]
    assert isinstance(plain, BlockStored) and plain.block_hashes == [11, b"\x02"]
    with pytest.raises(EventDecodeError):
        decode_message(encode_message(0, [_dict_stored(block_hashes=[11, True])]))
    with pytest.raises(EventDecodeError):
        decode_message(encode_message(0, [["BlockRemoved", [1.5]]]))


def test_consecutive_removals_of_one_medium_arrive_as_one_event_in_order() -> None:
    def removed(h: int, medium: str = "GPU") -> dict[str, object]:
        return {"type": "BlockRemoved", "block_hashes": [h], "medium": medium}

    batch = decode_message(
        encode_message(
            3,
            [
                removed(1),
                removed(2),
                _dict_stored(block_hashes=[1, 9]),
                removed(3),
                ["BlockRemoved", [4]],  # the older encoding joins the run
                removed(5, "CPU"),
                removed(6, "CPU"),
                {"type": "Future"},  # not counted, and does not break the run
                removed(7, "CPU"),
                {"type": "AllBlocksCleared"},
                removed(8),
            ],
        )
    )
    assert batch.events == [
        BlockRemoved([1, 2], "GPU"),
        batch.events[1],
        BlockRemoved([3, 4], "GPU"),
        BlockRemoved([5, 6, 7], "CPU"),
        AllBlocksCleared(),
        BlockRemoved([8], "GPU"),
    ]
    assert isinstance(batch.events[1], BlockStored) and batch.events[1].block_hashes == [1, 9]
    assert batch.count == 10


def test_token_ids_the_router_cannot_key_make_the_message_undecodable() -> None:
    """A negative token id, or one past 64 bits, would stop the index keying the blocks: the
    message is refused whole (counted as a decode error) instead of failing mid-apply. (msgpack
    carries no integer past 64 bits; a float is coerced to one.)"""
    for bad in (-1, 1e30):
        frames = encode_message(0, [_dict_stored(token_ids=[1, 2, 3, 4, 5, 6, 7, bad])])
        with pytest.raises(EventDecodeError, match="token_ids"):
            decode_message(frames)
