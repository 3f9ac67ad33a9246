"""Driving `gateway.proxy.relay_stream` without sockets: an engine's answer as given chunks,
and the client's side as a buffer (or aiohttp's own writer over a transport that records its
writes)."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

import pytest
from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import make_mocked_request

from hiveroute.engines.client import UpstreamAnswer
from hiveroute.gateway import proxy
from hiveroute.gateway.proxy import RelayResult


class _Content:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def readany(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


class _Upstream:
    status = 200
    headers: dict[str, str] = {}

    def __init__(self, chunks: list[bytes]) -> None:
        self.content = _Content(chunks)

    def close(self) -> None:
        pass


class Written:
    """What the relay wrote to its client."""

    def __init__(self) -> None:
        self.data = b""

    async def prepare(self, request: object) -> None:
        pass

    async def write(self, data: bytes) -> None:
        self.data += data

    async def write_eof(self) -> None:
        pass


def _answer(first: bytes, rest: list[bytes]) -> UpstreamAnswer:
    """An engine's streamed answer: `first` arrived at 1.0 on the relay's clock, `rest` to come."""
    return UpstreamAnswer(
        engine=None,  # type: ignore[arg-type]
        response=_Upstream(rest),  # type: ignore[arg-type]
        first_chunk=first,
        first_chunk_at=1.0,
    )


async def relay(
    monkeypatch: pytest.MonkeyPatch, first: bytes, rest: list[bytes], **options: Any
) -> tuple[Written, RelayResult]:
    """Relay an answer whose first chunk is `first` (arrived at 1.0 on the relay's clock), then
    `rest`; `options` go to relay_stream (the request started at 0.5)."""
    written = Written()
    monkeypatch.setattr(proxy, "RelayedStream", lambda **kw: written)
    answer = _answer(first, rest)
    _, result = await proxy.relay_stream(None, answer, {}, 0.5, **options)  # type: ignore[arg-type]
    return written, result


class RecordingTransport:
    """A client connection that keeps each write (a `writelines` is one write: one send)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: list[bytes]) -> None:
        self.writes.append(b"".join(parts))

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


async def relay_to_transport(first: bytes, rest: list[bytes]) -> RecordingTransport:
    """Relay an answer through aiohttp's own response and writer to a recording transport."""
    transport = RecordingTransport()
    protocol = mock.Mock(transport=transport, _paused=False)
    writer = StreamWriter(protocol, asyncio.get_running_loop())
    request = make_mocked_request("POST", "/v1/chat/completions", writer=writer)
    await proxy.relay_stream(request, _answer(first, rest), {}, 0.5)
    return transport
