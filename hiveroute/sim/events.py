"""KV events over ZMQ exactly as vLLM 0.32 publishes them.

Each message has three frames: the topic, an 8-byte big-endian sequence number, and a msgpack
payload `[ts, [event, ...], data_parallel_rank]`, each event a map with a `type` key (or, with
`legacy=True`, an array `["BlockStored", block_hashes, parent, token_ids, block_size, lora_id,
medium]` as vLLM sent before 0.9). A ROUTER replay socket answers a request
`[identity, b"", start_seq (8 bytes)]` with every buffered batch from that sequence number, each
as `[identity, b"", topic, seq, payload]`, then `[identity, b"", b"", -1 (8 bytes), b""]`.

`restart()` closes and rebinds both sockets and starts the sequence again at 0, as a restarted
vLLM does; the router must notice the gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from hiveroute.lifecycle import cancel_and_wait

log = logging.getLogger("hiveroute.sim.events")
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def legacy_event(event: dict[str, Any]) -> list[Any]:
    """The array form older vLLM used for one event."""
    kind = event["type"]
    if kind == "BlockStored":
        return [
            kind,
            event["block_hashes"],
            event["parent_block_hash"],
            event["token_ids"],
            event["block_size"],
            event["lora_id"],
            event["medium"],
        ]
    if kind == "BlockRemoved":
        return [kind, event["block_hashes"], event["medium"]]
    return [kind]


def encode_batch(
    events: list[dict[str, Any]], *, legacy: bool = False, ts: float | None = None
) -> bytes:
    """The msgpack payload of one batch."""
    items: list[Any] = [legacy_event(e) for e in events] if legacy else events
    return msgpack.packb([time.time() if ts is None else ts, items, 0], use_bin_type=True)


def bind_endpoint(socket: zmq.Socket[Any], host: str, port: int) -> str:
    """Bind to host:port (0: a free port) and return the tcp:// endpoint clients connect to."""
    if port == 0:
        port = socket.bind_to_random_port(f"tcp://{host}")
    else:
        socket.bind(f"tcp://{host}:{port}")
    shown = "127.0.0.1" if host in ("0.0.0.0", "*") else host
    return f"tcp://{shown}:{port}"


class EventPublisher:
    """PUB socket plus a replay ROUTER over a bounded buffer of past batches."""

    def __init__(
        self,
        host: str,
        port: int,
        replay_port: int | None,
        *,
        topic: str = "kv-events",
        legacy: bool = False,
        buffer_steps: int = 10_000,
    ) -> None:
        self.host = "*" if host == "0.0.0.0" else host
        self.topic = topic.encode()
        self.legacy = legacy
        self._requested_port = port
        self._requested_replay_port = replay_port
        self._ctx = zmq.asyncio.Context()
        self._sync_ctx = zmq.Context()  # the PUB socket sends without awaiting
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._pub: zmq.Socket[Any] | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.endpoint = ""
        self.replay_endpoint: str | None = None
        self.batches_sent = 0
        self.restarts = 0

    def start(self) -> None:
        pub = self._sync_ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        try:
            self.endpoint = bind_endpoint(pub, self.host, self._requested_port)
        except zmq.ZMQError as exc:
            pub.close(0)
            raise OSError(
                f"cannot bind KV-event socket on port {self._requested_port}: {exc}"
            ) from None
        self._requested_port = int(self.endpoint.rsplit(":", 1)[1])  # a restart keeps the port
        self._pub = pub
        if self._requested_replay_port is not None:
            replay = self._ctx.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            try:
                self.replay_endpoint = bind_endpoint(replay, self.host, self._requested_replay_port)
            except zmq.ZMQError as exc:
                replay.close(0)
                self._close_pub()
                raise OSError(
                    f"cannot bind KV-event replay socket on port {self._requested_replay_port}: {exc}"
                ) from None
            self._requested_replay_port = int(self.replay_endpoint.rsplit(":", 1)[1])
            self._replay = replay
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay())

    def publish(self, events: list[dict[str, Any]]) -> None:
        """Send one batch (one engine step's events) and keep it for replay."""
        pub = self._pub
        if pub is None or not events:
            return
        payload = encode_batch(events, legacy=self.legacy)
        seq = self._seq
        self._seq += 1
        seq_bytes = seq.to_bytes(8, "big")
        with contextlib.suppress(zmq.Again):
            pub.send_multipart((self.topic, seq_bytes, payload), flags=zmq.NOBLOCK)
        self._buffer.append((seq, payload))
        self.batches_sent += 1

    async def _serve_replay(self) -> None:
        replay = self._replay
        assert replay is not None
        while True:
            try:
                frames = await replay.recv_multipart()
            except (asyncio.CancelledError, zmq.ZMQError):
                return
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("ignoring malformed replay request (%d frames)", len(frames))
                continue
            identity, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big", signed=True)
            try:
                for seq, payload in list(self._buffer):
                    if seq >= start:
                        await replay.send_multipart(
                            (identity, b"", self.topic, seq.to_bytes(8, "big"), payload)
                        )
                await replay.send_multipart((identity, b"", b"", END_SEQ, b""))
            except zmq.ZMQError as exc:
                log.warning("replay reply failed: %s", exc)

    def _close_pub(self) -> None:
        if self._pub is not None:
            self._pub.close(0)
            self._pub = None

    async def _close_replay(self) -> None:
        await cancel_and_wait(self._replay_task)
        self._replay_task = None
        if self._replay is not None:
            self._replay.close(0)
            self._replay = None

    async def restart(self) -> None:
        """Close and rebind on the same ports; sequence numbers and the buffer start again."""
        self._close_pub()
        await self._close_replay()
        self._seq = 0
        self._buffer.clear()
        self.restarts += 1
        await asyncio.sleep(0.05)  # let the OS release the ports
        self.start()

    async def stop(self) -> None:
        self._close_pub()
        await self._close_replay()
        self._ctx.term()
        self._sync_ctx.term()
