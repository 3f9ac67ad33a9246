"""One host's router workers share one in-memory store, without Redis.

`hiveroute serve --workers N` runs N processes; what they must agree on (workflow records and
homes, shared contexts, anything else kept in the StateStore) lives in one MemoryStateStore
owned by the parent process and served on a Unix socket by `StateServer`. Each worker talks to
it through `SharedStateClient`, which implements the StateStore interface.

The wire is length-prefixed JSON frames (orjson). A frame carries every call a worker made in one
event-loop turn, ``[[id, method, args, kwargs], ...]``, and the server answers each frame with
one frame of replies, ``[[id, ok, result], ...]``: a request's bookkeeping (a few dozen calls in
a few rounds) costs a few frames, not one per call, which was most of what a worker spent on
shared state. Calls are pipelined on one connection per worker; the server runs each
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
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

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
        "hincrby_many",
        "hincrbyfloat",
        "push_bounded",
        "lrange",
    }
)


class _Batcher:
    """Messages sent in one event-loop turn go out as one frame in one write (one system call):
    a request makes several state calls at once (`all_of`), and a worker serves many requests."""

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self.transport = transport
        self._messages: list[list[Any]] = []

    def send(self, message: list[Any]) -> None:
        if not self._messages:
            asyncio.get_running_loop().call_soon(self._flush)
        self._messages.append(message)

    def _flush(self) -> None:
        messages, self._messages = self._messages, []
        if not self.transport.is_closing():
            self.transport.write(_frame(messages))


def _frame(messages: list[list[Any]]) -> bytes:
    payload = orjson.dumps(messages)
    return _FRAME.pack(len(payload)) + payload


def _take_frame(buffer: bytearray) -> list[Any] | None:
    """The first whole frame's messages, taken off the front of `buffer`; None while the frame
    is still arriving. ValueError for a frame over the limit or not a list of messages."""
    if len(buffer) < _FRAME.size:
        return None
    (size,) = _FRAME.unpack_from(buffer)
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"state frame of {size} bytes is over the limit")
    end = _FRAME.size + size
    if len(buffer) < end:
        return None
    messages = orjson.loads(buffer[_FRAME.size : end])
    del buffer[:end]
    if not isinstance(messages, list):
        raise ValueError("a state frame must hold a list of messages")
    return messages


def run_now(operation: Coroutine[Any, Any, Any]) -> Any:
    """The result of a memory-store operation, run to its end at once: none of them suspends
    (which is what makes each atomic across workers), so the server needs no task per call."""
    try:
        operation.send(None)
    except StopIteration as done:
        return done.value
    operation.close()
    raise RuntimeError("a memory-store operation suspended")


class _ServerSide(asyncio.Protocol):
    """One worker's connection to the parent's store. The calls of each frame run in order,
    each to its end, as they arrive; the replies to what one read brought go back in one
    frame. Protocol callbacks rather than a stream reader's task: the parent answers every
    request's bookkeeping, and a frame through a reader cost two awaits and their futures (one
    request at a time, the bookkeeping costs ×0.91 without them,
    benchmarks/results/state_protocol.md)."""

    def __init__(self, store: MemoryStateStore, connections: set[asyncio.Transport]) -> None:
        self.store = store
        self.connections = connections
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's are not asyncio.Transport subclasses, only alike)
        self._transport = cast(asyncio.Transport, transport)
        self.connections.add(self._transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self.connections.discard(self._transport)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        assert transport is not None
        self._buffer += data
        replies: list[list[Any]] = []
        try:
            while (calls := _take_frame(self._buffer)) is not None:
                for call_id, method, args, kwargs in calls:
                    replies.append(self._call(call_id, method, args, kwargs))
        except (ValueError, TypeError) as exc:  # a malformed frame: drop that connection
            log.warning("state server: bad frame from a worker: %s", exc)
            transport.close()
            return
        if replies:
            transport.write(_frame(replies))

    # A worker that stops reading its replies is not sent more than the transport's buffer:
    # the server stops reading its calls until the replies drain.
    def pause_writing(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    def _call(
        self, call_id: int, method: str, args: list[Any], kwargs: dict[str, Any]
    ) -> list[Any]:
        if method not in METHODS:
            return [call_id, False, ["ValueError", f"unknown state method {method!r}"]]
        try:
            result = run_now(getattr(self.store, method)(*args, **kwargs))
        except (TypeError, ValueError) as exc:
            return [call_id, False, [type(exc).__name__, str(exc)]]
        return [call_id, True, result]


class StateServer:
    """The parent's store, served to its workers on a Unix socket."""

    def __init__(self, path: str, store: MemoryStateStore | None = None) -> None:
        self.path = path
        self.store = store if store is not None else MemoryStateStore()
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Transport] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: _ServerSide(self.store, self._connections), path=self.path
        )
        os.chmod(self.path, 0o600)  # the router's own user only

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for transport in list(self._connections):
                transport.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class _ClientSide(asyncio.Protocol):
    """A worker's end of its connection: each reply that arrives is handed to `resolve`; when
    the connection ends, `lost` hears this side and why (a later connection may be current by
    then)."""

    def __init__(
        self,
        resolve: Callable[[list[Any]], None],
        lost: Callable[[_ClientSide, BaseException], None],
    ) -> None:
        self.resolve = resolve
        self.lost = lost
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            while (replies := _take_frame(self._buffer)) is not None:
                for reply in replies:
                    self.resolve(reply)
        except (ValueError, TypeError) as exc:
            self.lost(self, ConnectionError(f"shared state server: {exc}"))
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost(self, ConnectionError("the shared state server closed the connection"))


class SharedStateClient:
    """The StateStore interface, served by the parent's `StateServer` (one worker's view)."""

    name = "memory"
    in_process = False

    def __init__(self, path: str) -> None:
        self.path = path
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._side: _ClientSide | None = None  # the current connection
        self._calls: _Batcher | None = None
        self._connecting: asyncio.Lock | None = None

    async def _connect(self) -> None:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._side is None:
                loop = asyncio.get_running_loop()
                transport, side = await loop.create_unix_connection(
                    lambda: _ClientSide(self._resolve, self._lost), self.path
                )
                self._side = side
                self._calls = _Batcher(cast(asyncio.WriteTransport, transport))

    def _resolve(self, reply: list[Any]) -> None:
        call_id, ok, result = reply
        future = self._pending.pop(call_id, None)
        if future is None or future.done():
            return
        if ok:
            future.set_result(result)
        else:
            kind, message = result
            future.set_exception(TypeError(message) if kind == "TypeError" else ValueError(message))

    def _lost(self, side: _ClientSide, error: BaseException) -> None:
        """The connection is over: its calls in flight fail; the next call connects again."""
        if side is not self._side:
            return  # an earlier connection, already given up
        self._side = self._calls = None
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Send one call (with this turn's others, in one frame) and return its reply's future.

        A future, not a coroutine: `all_of` gathers a request's calls without wrapping each in
        a task, which cost more than the call itself. The server's store returns each result
        already in its type (JSON keeps ints, floats, booleans, lists and objects apart)."""
        calls = self._calls
        if calls is None:  # not connected yet, or the connection was lost: connect first
            return asyncio.ensure_future(self._connect_and_call(method, args, kwargs))
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        calls.send([call_id, method, list(args), kwargs])
        return future

    async def _connect_and_call(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        await self._connect()
        return await self._call(method, *args, **kwargs)

    # strings --------------------------------------------------------------------------------

    def get(self, key: str) -> Awaitable[str | None]:
        return self._call("get", key)

    def set(self, key: str, value: str, *, ttl_s: float | None = None) -> Awaitable[None]:
        return self._call("set", key, value, ttl_s=ttl_s)

    def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> Awaitable[bool]:
        return self._call("set_if_absent", key, value, ttl_s=ttl_s)

    def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> Awaitable[bool]:
        return self._call("compare_and_set", key, expected, value, ttl_s=ttl_s)

    def delete(self, *keys: str) -> Awaitable[int]:
        return self._call("delete", *keys)

    def expire(self, key: str, ttl_s: float | None) -> Awaitable[bool]:
        return self._call("expire", key, ttl_s)

    def scan(self, prefix: str, *, limit: int = 10_000) -> Awaitable[list[str]]:
        return self._call("scan", prefix, limit=limit)

    # hashes ---------------------------------------------------------------------------------

    def hget(self, key: str, field: str) -> Awaitable[str | None]:
        return self._call("hget", key, field)

    def hgetall(self, key: str) -> Awaitable[dict[str, str]]:
        return self._call("hgetall", key)

    def hset(self, key: str, mapping: dict[str, str]) -> Awaitable[None]:
        return self._call("hset", key, mapping)

    def hdel(self, key: str, *fields: str) -> Awaitable[int]:
        return self._call("hdel", key, *fields)

    def hincrby(self, key: str, field: str, amount: int = 1) -> Awaitable[int]:
        return self._call("hincrby", key, field, amount)

    def hincrby_many(self, key: str, increments: dict[str, int]) -> Awaitable[dict[str, int]]:
        return self._call("hincrby_many", key, increments)

    def hincrbyfloat(self, key: str, field: str, amount: float) -> Awaitable[float]:
        return self._call("hincrbyfloat", key, field, amount)

    # bounded lists --------------------------------------------------------------------------

    def push_bounded(self, key: str, value: str, max_len: int) -> Awaitable[list[str]]:
        return self._call("push_bounded", key, value, max_len)

    def lrange(self, key: str, start: int = 0, stop: int = -1) -> Awaitable[list[str]]:
        return self._call("lrange", key, start, stop)

    # lifecycle ------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close this worker's connection (the parent's store and its data stay)."""
        side = self._side
        if side is not None:
            self._lost(side, ConnectionError("the shared state client was closed"))
            if side.transport is not None:
                side.transport.close()
