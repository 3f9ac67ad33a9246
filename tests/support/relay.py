"""Driving `gateway.proxy.relay_stream` without sockets: an engine's answer as given chunks,
and the client's side as a buffer."""

from __future__ import annotations

from typing import Any

import pytest

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


async def relay(
    monkeypatch: pytest.MonkeyPatch, first: bytes, rest: list[bytes], **options: Any
) -> tuple[Written, RelayResult]:
    """Relay an answer whose first chunk is `first` (arrived at 1.0 on the relay's clock), then
    `rest`; `options` go to relay_stream (the request started at 0.5)."""
    answer = UpstreamAnswer(
        engine=None,  # type: ignore[arg-type]
        response=_Upstream(rest),  # type: ignore[arg-type]
        first_chunk=first,
        first_chunk_at=1.0,
    )
    written = Written()
    monkeypatch.setattr(proxy.web, "StreamResponse", lambda **kw: written)
    _, result = await proxy.relay_stream(None, answer, {}, 0.5, **options)  # type: ignore[arg-type]
    return written, result
