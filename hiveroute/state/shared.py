"""One host's router workers share one in-memory store, without Redis.

`hiveroute serve --workers N` runs N processes; what they must agree on (workflow records and
homes, shared contexts, anything else kept in the StateStore) lives in one MemoryStateStore
owned by the parent process and served on a Unix socket by `StateServer`. Each worker talks to
it through `SharedStateClient`, which implements the StateStore interface.

The wire is length-prefixed JSON frames (orjson): a call ``[id, method, args, kwargs]`` and a reply
``[id, ok, result]``. Calls are pipelined on one connection per worker; the server runs each
connection's calls in order, and the memory store's operations never yield, so every call
(`set_if_absent`, `compare_and_set`, `hincrby`, ...) is atomic across workers, as in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import struct
from typing import Any

import orjson

from hiveroute.state.memory import MemoryStateStore

log = logging.getLogger("hiveroute.state")

_FRAME = struct.Struct("!I")
MAX_FRAME_BYTES = 64 * 1024 * 1024
# The StateStore interface, and nothing else, is callable over the socket.
METHODS = frozenset(
    {
        "get",
        "set",
        "set_if_absent",
        "compare_and_set",
        "delete",
        "expire",
        "scan",
        "hget",
        "hgetall",
        "hset",
        "hdel",
        "hincrby",
        "hincrbyfloat",
        "push_bounded",
        "lrange",
    }
)


def _encode(message: list[Any]) -> bytes:
    payload = orjson.dumps(message)
    return _FRAME.pack(len(payload)) + payload


class _Batcher:
    """Frames written in one event-loop turn go out in one write (one system call): a request
    makes several state calls at once (asyncio.gather), and a worker serves many requests."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._frames: list[bytes] = []

    def send(self, frame: bytes) -> None:
        if not self._frames:
            asyncio.get_running_loop().call_soon(self._flush)
        self._frames.append(frame)

    def _flush(self) -> None:
        frames, self._frames = self._frames, []
        if not self.writer.is_closing():
            self.writer.write(b"".join(frames))


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"state frame of {size} bytes is over the limit")
    return orjson.loads(await reader.readexactly(size))


class StateServer:
    """The parent's store, served to its workers on a Unix socket."""

    def __init__(self, path: str, store: MemoryStateStore | None = None) -> None:
        self.path = path
        self.store = store if store is not None else MemoryStateStore()
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o600)  # the router's own user only

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._connections):
                writer.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        replies = _Batcher(writer)
        try:
            while True:
                try:
                    call_id, method, args, kwargs = await _read_frame(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                replies.send(_encode(await self._call(call_id, method, args, kwargs)))
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()
        except (ValueError, TypeError) as exc:  # a malformed frame: drop that connection
            log.warning("state server: bad frame from a worker: %s", exc)
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _call(
        self, call_id: int, method: str, args: list[Any], kwargs: dict[str, Any]
    ) -> list[Any]:
        if method not in METHODS:
            return [call_id, False, ["ValueError", f"unknown state method {method!r}"]]
        try:
            result = await getattr(self.store, method)(*args, **kwargs)
        except (TypeError, ValueError) as exc:
            return [call_id, False, [type(exc).__name__, str(exc)]]
        return [call_id, True, result]


class SharedStateClient:
    """The StateStore interface, served by the parent's `StateServer` (one worker's view)."""

    name = "memory"
    in_process = False

    def __init__(self, path: str) -> None:
        self.path = path
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._calls: _Batcher | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock | None = None

    async def _connect(self) -> asyncio.StreamWriter:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._writer is None:
                reader, writer = await asyncio.open_unix_connection(self.path)
                self._writer = writer
                self._calls = _Batcher(writer)
                self._reader_task = asyncio.create_task(self._read(reader), name="state-client")
        return self._writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        error: BaseException = ConnectionError("the shared state server closed the connection")
        try:
            while True:
                call_id, ok, result = await _read_frame(reader)
                future = self._pending.pop(call_id, None)
                if future is None or future.done():
                    continue
                if ok:
                    future.set_result(result)
                else:
                    kind, message = result
                    future.set_exception(
                        TypeError(message) if kind == "TypeError" else ValueError(message)
                    )
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            error = ConnectionError(f"shared state server: {exc}")
        finally:
            self._writer = self._calls = None
            pending, self._pending = self._pending, {}
            for future in pending.values():
                if not future.done():
                    future.set_exception(error)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._writer is None:
            await self._connect()
        calls = self._calls
        assert calls is not None
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        calls.send(_encode([call_id, method, list(args), kwargs]))
        return await future

    # strings --------------------------------------------------------------------------------

    async def get(self, key: str) -> str | None:
        value: str | None = await self._call("get", key)
        return value

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        await self._call("set", key, value, ttl_s=ttl_s)

    async def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> bool:
        return bool(await self._call("set_if_absent", key, value, ttl_s=ttl_s))

    async def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> bool:
        return bool(await self._call("compare_and_set", key, expected, value, ttl_s=ttl_s))

    async def delete(self, *keys: str) -> int:
        return int(await self._call("delete", *keys))

    async def expire(self, key: str, ttl_s: float | None) -> bool:
        return bool(await self._call("expire", key, ttl_s))

    async def scan(self, prefix: str, *, limit: int = 10_000) -> list[str]:
        found: list[str] = await self._call("scan", prefix, limit=limit)
        return found

    # hashes ---------------------------------------------------------------------------------

    async def hget(self, key: str, field: str) -> str | None:
        value: str | None = await self._call("hget", key, field)
        return value

    async def hgetall(self, key: str) -> dict[str, str]:
        found: dict[str, str] = await self._call("hgetall", key)
        return found

    async def hset(self, key: str, mapping: dict[str, str]) -> None:
        await self._call("hset", key, mapping)

    async def hdel(self, key: str, *fields: str) -> int:
        return int(await self._call("hdel", key, *fields))

    async def hincrby(self, key: str, field: str, amount: int = 1) -> int:
        return int(await self._call("hincrby", key, field, amount))

    async def hincrbyfloat(self, key: str, field: str, amount: float) -> float:
        return float(await self._call("hincrbyfloat", key, field, amount))

    # bounded lists --------------------------------------------------------------------------

    async def push_bounded(self, key: str, value: str, max_len: int) -> list[str]:
        dropped: list[str] = await self._call("push_bounded", key, value, max_len)
        return dropped

    async def lrange(self, key: str, start: int = 0, stop: int = -1) -> list[str]:
        found: list[str] = await self._call("lrange", key, start, stop)
        return found

    # lifecycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close this worker's connection (the parent's store and its data stay)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
            self._reader_task = None
