"""Decoding vLLM's KV-event messages, in both encodings vLLM has used.

A message is three ZMQ frames: topic, an 8-byte big-endian sequence number, and a msgpack
payload ``[ts, [event, ...], dp_rank]``. vLLM ≥ 0.11-ish sends each event as a map tagged by
``"type"``; earlier releases sent tagged arrays whose fields follow the struct's order:

- ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
  medium?, lora_name?]`` (medium since 0.10, lora_name later);
- ``["BlockRemoved", block_hashes, medium?]``;
- ``["AllBlocksCleared"]``.

Engine block hashes are ints or bytes depending on the hash algorithm; both are kept as given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from hiveroute.kvindex.blocks import keyable

EngineHash = int | bytes

GPU = "GPU"


class EventDecodeError(ValueError):
    """A message that is not a KV-event batch (wrong frames, bad msgpack, unknown shape)."""


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    token_ids: list[int]
    block_size: int
    medium: str = GPU
    lora_name: str | None = None
    extra_keys: list[Any] | None = None

    @property
    def cache_salt(self) -> str | None:
        """The salt mixed into the first block, when this event starts a chain.

        vLLM publishes block 0's extra keys untagged: the LoRA name, multimodal pairs, the
        cache_salt string and prompt-embedding digests (bytes). The salt is the string that is
        not the LoRA name.
        """
        if self.parent_block_hash is not None or not self.extra_keys:
            return None
        first = self.extra_keys[0]
        if not isinstance(first, (list, tuple)):
            return None
        strings = [k for k in first if isinstance(k, str)]
        if self.lora_name is not None and strings and strings[0] == self.lora_name:
            strings = strings[1:]
        return strings[-1] if strings else None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[EngineHash]
    medium: str = GPU


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass
class EventBatch:
    seq: int
    ts: float
    events: list[KvEvent] = field(default_factory=list)
    dp_rank: int | None = None
    # events the message carried that this router uses, before consecutive removals of one
    # medium were merged into one `BlockRemoved` (what `hiveroute_kv_events_total` counts)
    count: int = 0


def _hash(value: Any) -> EngineHash:
    if isinstance(value, (int, bytes)) and not isinstance(value, bool):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    raise EventDecodeError(f"block hash must be an int or bytes, got {type(value).__name__}")


# What msgpack gives for valid fields. Checking a list's element types in one C-level pass
# (`issuperset(map(type, ...))`) costs a third of a Python step per element: a busy engine's
# events carry every prefilled token, and decoding them was a quarter of the router's CPU.
_HASH_TYPES = frozenset({int, bytes})
_TOKEN_TYPES = frozenset({int})


def _checked(
    value: list[Any] | tuple[Any, ...], types: frozenset[type], each: Callable[[Any], Any]
) -> list[Any]:
    """`value` as a list: as it is when every element's type is in `types` (one C-level
    pass), else each element through `each` (which converts it or raises EventDecodeError)."""
    if types.issuperset(map(type, value)):
        return value if type(value) is list else list(value)
    return [each(v) for v in value]


def _token(value: Any) -> int:
    """A token id msgpack gave as another type than int: an integral float (or a bool) is
    taken as its integer; anything else (None, a string, 2.5) refuses the event."""
    try:
        token = int(value)
    except (TypeError, ValueError, OverflowError):
        token = None
    if token is None or token != value:
        raise EventDecodeError(f"token ids must be integers, got {value!r:.40}")
    return token


def _hashes(value: Any) -> list[EngineHash]:
    if not isinstance(value, (list, tuple)):
        raise EventDecodeError("block_hashes must be a list")
    return _checked(value, _HASH_TYPES, _hash)


def _medium(value: Any) -> str:
    return value.upper() if isinstance(value, str) and value else GPU


def _stored(fields: dict[str, Any]) -> BlockStored:
    tokens = fields.get("token_ids")
    size = fields.get("block_size")
    if not isinstance(tokens, (list, tuple)) or not isinstance(size, int) or size <= 0:
        raise EventDecodeError("BlockStored needs token_ids (list) and block_size (int > 0)")
    token_ids = _checked(tokens, _TOKEN_TYPES, _token)
    if not keyable(token_ids):
        raise EventDecodeError("BlockStored token_ids must be from 0 to 2**64 - 1")
    parent = fields.get("parent_block_hash")
    lora = fields.get("lora_name")
    extra = fields.get("extra_keys")
    return BlockStored(
        block_hashes=_hashes(fields.get("block_hashes")),
        parent_block_hash=None if parent is None else _hash(parent),
        token_ids=token_ids,
        block_size=size,
        medium=_medium(fields.get("medium")),
        lora_name=lora if isinstance(lora, str) else None,
        extra_keys=list(extra) if isinstance(extra, (list, tuple)) else None,
    )


ARRAY_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _kind_and_fields(raw: Any) -> tuple[Any, dict[Any, Any]]:
    """An event's type and its fields by name, from either encoding."""
    if isinstance(raw, dict):
        return raw.get("type"), raw
    if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        names = ARRAY_FIELDS.get(raw[0], ())
        return raw[0], dict(zip(names, raw[1:], strict=False))
    raise EventDecodeError(f"an event must be a map or a tagged array, got {raw!r:.80}")


def _event(kind: Any, fields: dict[Any, Any]) -> KvEvent | None:
    if kind == "BlockStored":
        return _stored(fields)
    if kind == "BlockRemoved":
        return BlockRemoved(_hashes(fields.get("block_hashes")), _medium(fields.get("medium")))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_event(raw: Any) -> KvEvent | None:
    """One event from either encoding; None for event types this router does not use."""
    return _event(*_kind_and_fields(raw))


def decode_payload(seq: int, payload: bytes) -> EventBatch:
    """A batch from its msgpack payload ``[ts, [events...], dp_rank?]``."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (
        ValueError,
        TypeError,
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
    ) as exc:
        # TypeError: a map whose key is a list or a map (unhashable)
        raise EventDecodeError(f"payload is not msgpack: {exc}") from None
    if not isinstance(raw, (list, tuple)) or len(raw) < 2 or not isinstance(raw[1], list):
        raise EventDecodeError("payload must be [ts, [events...], dp_rank]")
    try:
        events, count = _decode_events(raw[1])
    except EventDecodeError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # a shape the checks did not foresee
        raise EventDecodeError(f"malformed event: {type(exc).__name__}: {exc}") from None
    rank = raw[2] if len(raw) > 2 and isinstance(raw[2], int) else None
    ts = float(raw[0]) if isinstance(raw[0], (int, float)) else 0.0
    return EventBatch(seq=seq, ts=ts, events=events, dp_rank=rank, count=count)


def _decode_events(raw_events: list[Any]) -> tuple[list[KvEvent], int]:
    """The events in order, each run of consecutive removals of one medium as one event, and
    how many events there were. vLLM publishes an eviction as one `BlockRemoved` per block: an
    engine evicting under load sends thousands a second, and decoding and applying them one by
    one cost the router more than everything else it does. A run applied at once is the same
    as one by one."""
    events: list[KvEvent] = []
    run: list[EngineHash] = []
    run_medium = GPU
    count = 0
    for raw in raw_events:
        kind, fields = _kind_and_fields(raw)
        if kind == "BlockRemoved":  # no object of its own: its hashes join the run
            count += 1
            medium = _medium(fields.get("medium"))
            if run and medium != run_medium:
                events.append(BlockRemoved(run, run_medium))
                run = []
            run_medium = medium
            run.extend(_hashes(fields.get("block_hashes")))
            continue
        event = _event(kind, fields)
        if event is None:
            continue
        count += 1
        if run:
            events.append(BlockRemoved(run, run_medium))
            run = []
        events.append(event)
    if run:
        events.append(BlockRemoved(run, run_medium))
    return events, count


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """A batch from the three frames (topic, seq, payload) of a PUB message."""
    if len(frames) != 3:
        raise EventDecodeError(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    _, seq_bytes, payload = frames
    if len(seq_bytes) != 8:
        raise EventDecodeError("sequence frame must be 8 bytes")
    return decode_payload(int.from_bytes(seq_bytes, "big", signed=True), payload)


def encode_message(
    seq: int, events: list[dict[str, Any] | list[Any]], *, topic: bytes = b"kv-events"
) -> list[bytes]:
    """Frames as vLLM's publisher sends them (tests and the simulator use this)."""
    import time

    payload = msgpack.packb([time.time(), events, 0], use_bin_type=True)
    return [topic, seq.to_bytes(8, "big", signed=True), payload]
