"""A KV-event subscriber for tests: vLLM 0.32 maps and the older arrays, as raw dicts.

Used on the simulator and on real vLLM alike, so both are read by the same code. It keeps every
field of the wire format (the router's decoder, hiveroute.kvindex.events, drops the ones it does
not use), so tests can compare the simulator's messages with vLLM's field by field.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from hiveroute.kvindex.events import ARRAY_FIELDS


def decode_event(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    kind, *values = raw
    return {"type": kind, **dict(zip(ARRAY_FIELDS[kind], values, strict=False))}


def decode_payload(payload: bytes) -> tuple[float, list[dict[str, Any]]]:
    ts, events, *_ = msgpack.unpackb(payload, raw=False)
    return ts, [decode_event(e) for e in events]


@dataclass
class Subscriber:
    endpoint: str
    topic: str = "kv-events"
    ctx: zmq.asyncio.Context = field(default_factory=zmq.asyncio.Context)
    seqs: list[int] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt_string(zmq.SUBSCRIBE, self.topic)
        self.sock.connect(self.endpoint)

    async def settle(self) -> None:
        """PUB/SUB joins asynchronously: give the subscription time to reach the publisher."""
        await asyncio.sleep(0.3)

    async def drain(self, quiet_s: float = 0.3, limit_s: float = 10.0) -> list[dict[str, Any]]:
        """Receive until nothing arrives for `quiet_s`; returns the events received."""
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if not await self.sock.poll(int(quiet_s * 1000)):
                break
            topic, seq, payload = await self.sock.recv_multipart()
            assert topic == self.topic.encode()
            self.seqs.append(int.from_bytes(seq, "big"))
            got.extend(decode_payload(payload)[1])
        self.events.extend(got)
        return got

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


async def replay(endpoint: str, start: int, limit_s: float = 5.0) -> list[tuple[int, bytes]]:
    """Ask a replay ROUTER for batches from `start`; returns (seq, payload) up to the -1 marker."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    out: list[tuple[int, bytes]] = []
    try:
        await sock.send_multipart((b"", start.to_bytes(8, "big")))
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if not await sock.poll(int(limit_s * 1000)):
                break
            frames = await sock.recv_multipart()
            _, _topic, seq, payload = frames
            number = int.from_bytes(seq, "big", signed=True)
            if number == -1:
                return out
            out.append((number, payload))
        raise TimeoutError("replay gave no -1 end marker")
    finally:
        sock.close(0)
        ctx.term()


def stored_blocks(events: list[dict[str, Any]]) -> list[list[int]]:
    """Token ids of each stored block, in order, cut at block boundaries."""
    blocks: list[list[int]] = []
    for event in events:
        if event["type"] == "BlockStored":
            size = event["block_size"]
            tokens = event["token_ids"]
            assert len(tokens) == size * len(event["block_hashes"])
            blocks.extend(tokens[i : i + size] for i in range(0, len(tokens), size))
    return blocks


def removed_blocks(events: list[dict[str, Any]]) -> list[list[int]]:
    """Token ids of each removed block, looked up from earlier BlockStored events."""
    by_hash: dict[Any, list[int]] = {}
    removed: list[list[int]] = []
    for event in events:
        if event["type"] == "BlockStored":
            size = event["block_size"]
            for i, h in enumerate(event["block_hashes"]):
                by_hash[h] = event["token_ids"][i * size : (i + 1) * size]
        elif event["type"] == "BlockRemoved":
            removed.extend(by_hash[h] for h in event["block_hashes"])
    return removed
