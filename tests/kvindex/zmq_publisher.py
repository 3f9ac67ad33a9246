"""A KV-event publisher driven by tests: vLLM's wire format, a replay buffer, lost messages."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import zmq
import zmq.asyncio

from hiveroute.kvindex.events import encode_message


def _bind(ctx: zmq.asyncio.Context, kind: int, port: int) -> tuple[zmq.asyncio.Socket, int]:
    """Bind a socket to `port` (0: a free one), retrying while a restart frees the port."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if not port:
        return sock, sock.bind_to_random_port("tcp://127.0.0.1")
    for attempt in range(50):
        try:
            sock.bind(f"tcp://127.0.0.1:{port}")
            return sock, port
        except zmq.ZMQError:
            if attempt == 49:
                sock.close(linger=0)
                raise
            time.sleep(0.02)
    raise AssertionError("unreachable")


class FakePublisher:
    """XPUB (so a test can wait for the subscription) plus a ROUTER replay socket."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        *,
        port: int = 0,
        replay_port: int = 0,
        replay: bool = True,
    ) -> None:
        self.ctx = ctx
        self.pub, self.port = _bind(ctx, zmq.XPUB, port)
        self.router: zmq.asyncio.Socket | None = None
        self.replay_port: int | None = None
        if replay:
            self.router, self.replay_port = _bind(ctx, zmq.ROUTER, replay_port)
        self.buffer: list[tuple[int, list[bytes]]] = []
        self.seq = 0
        self.truth: set[Any] = set()  # engine hashes the engine holds, as its events say
        self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str | None:
        return f"tcp://127.0.0.1:{self.replay_port}" if self.replay_port else None

    async def wait_subscribed(self) -> None:
        async with asyncio.timeout(5):
            while True:
                message = await self.pub.recv()
                if message[:1] == b"\x01":
                    return

    async def publish(self, events: list[Any], *, lose: bool = False) -> int:
        """Send one batch (or only buffer it, as if the network dropped it)."""
        seq = self.seq
        self.seq += 1
        frames = encode_message(seq, events)
        self.buffer.append((seq, frames))
        for event in events:
            if isinstance(event, dict):
                kind, hashes = event["type"], event.get("block_hashes", [])
            else:
                kind, hashes = event[0], (event[1] if len(event) > 1 else [])
            if kind == "BlockStored":
                self.truth |= set(hashes)
            elif kind == "BlockRemoved":
                self.truth -= set(hashes)
            else:
                self.truth.clear()
        if not lose:
            await self.pub.send_multipart(frames)
        return seq

    async def _serve_replay(self) -> None:
        if self.router is None:
            return
        while True:
            identity, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, frames in self.buffer:
                if seq >= first:
                    await self.router.send_multipart([identity, b"", *frames])
            end = (-1).to_bytes(8, "big", signed=True)
            await self.router.send_multipart([identity, b"", b"", end, b""])

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)


def stored(hashes: list[int], tokens: list[int], parent: int | None = None, bs: int = 4) -> dict:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": bs,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def removed(hashes: list[int]) -> dict:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


async def wait_until(predicate: Any, timeout_s: float = 5.0) -> None:
    """Poll `predicate` until true (bounded)."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)
