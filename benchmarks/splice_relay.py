"""The floor of any Python router on uvloop: bytes spliced between sockets, no HTTP library.

    python -m benchmarks.splice_relay PORT --engine URL [--engine URL ...]

Each request (its head and a Content-Length body) goes to the next engine in turn over a kept
connection; the engine's answer is written back as its bytes arrive, head and body verbatim,
chunked framing included, without a task or a future per chunk. It reads the framing only to
find where an answer ends (so the engine's connection can be kept) and decides nothing.
`benchmarks.relay_chunks --targets splice-relay` measures what relaying a streamed chunk costs
at this floor, beside aiohttp's (`aiohttp-relay`) and the routers'. Not a router: no timeouts,
no errors in any API's shape, one request at a time per client connection.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from urllib.parse import urlsplit

from hiveroute import runtime

HEAD_END = b"\r\n\r\n"


class BodyEnd:
    """Finds where an HTTP/1.1 answer's body ends, by Content-Length or chunked framing."""

    def __init__(self, head: bytes) -> None:
        self.chunked = False
        self.left = 0  # bytes of the body (Content-Length) or of the current chunk and its CRLF
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                self.left = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
        self.line = b""  # a chunk-size line read in part
        self.last = False  # the zero-size chunk was read: what is left is the trailer's CRLF

    def feed(self, data: bytes) -> bool:
        """Whether the body ends within `data` (which is all of this answer's next bytes)."""
        if not self.chunked:
            self.left -= len(data)
            return self.left <= 0
        at = 0
        while at < len(data):
            if self.left:
                step = min(self.left, len(data) - at)
                self.left -= step
                at += step
                if self.last and not self.left:
                    return True
                continue
            line = self.line + data[at:]  # a size line may arrive in pieces, even its CRLF
            end = line.find(b"\r\n")
            if end < 0:
                self.line = line
                return False
            size = int(line[:end].split(b";")[0], 16)
            at += end + 2 - len(self.line)
            self.line = b""
            self.last = size == 0
            self.left = size + 2  # the chunk's bytes and its CRLF (the last: the trailer's)
        return False


class EngineSide(asyncio.Protocol):
    """One kept connection to an engine; writes its answer to the client that asked."""

    def __init__(self, pool: list[EngineSide]) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.client: ClientSide | None = None
        self.head = b""
        self.end: BodyEnd | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None:
            return
        body = data
        if self.end is None:
            self.head += data
            cut = self.head.find(HEAD_END)
            if cut < 0:
                return
            self.end = BodyEnd(self.head[:cut])
            body = self.head[cut + 4 :]
            client.write(self.head[: cut + 4])
            self.head = b""
        if body:
            client.write(body)
            done = self.end.feed(body)
        else:  # the head alone: only an empty Content-Length body has ended
            done = not self.end.chunked and self.end.left == 0
        if done:
            self.client, self.end = None, None
            self.pool.append(self)
            client.answered()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)
        if self.client is not None:
            self.client.close()


class ClientSide(asyncio.Protocol):
    """One client connection: reads a request, sends it on, takes the next when answered."""

    def __init__(self, engines: itertools.cycle[tuple[str, int, list[EngineSide]]]) -> None:
        self.engines = engines
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.busy = False
        self.sending: asyncio.Task[None] | None = None  # held: the loop keeps only weak refs

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.next_request()

    def answered(self) -> None:
        self.busy = False
        self.next_request()

    def next_request(self) -> None:
        cut = self.buffer.find(HEAD_END)
        if self.busy or cut < 0:
            return
        head = self.buffer[:cut]
        length = BodyEnd(head).left  # a request's body: by its Content-Length only
        if len(self.buffer) < cut + 4 + length:
            return
        request, self.buffer = self.buffer[: cut + 4 + length], self.buffer[cut + 4 + length :]
        if head.startswith(b"GET /health "):
            self.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            self.next_request()
            return
        self.busy = True
        self.sending = asyncio.get_running_loop().create_task(self.send(request))

    async def send(self, request: bytes) -> None:
        host, port, pool = next(self.engines)
        if pool:
            engine = pool.pop()
        else:
            loop = asyncio.get_running_loop()
            _, engine = await loop.create_connection(lambda: EngineSide(pool), host, port)
        engine.client = self
        assert engine.transport is not None
        engine.transport.write(request)


async def start(port: int, engine_urls: list[str]) -> asyncio.Server:
    """The relay, listening on 127.0.0.1:port (0: a free port)."""
    engines: list[tuple[str, int, list[EngineSide]]] = []
    for url in engine_urls:
        parts = urlsplit(url)
        engines.append((parts.hostname or "127.0.0.1", parts.port or 80, []))
    turn = itertools.cycle(engines)
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: ClientSide(turn), "127.0.0.1", port)


async def serve(port: int, engine_urls: list[str]) -> None:
    async with await start(port, engine_urls):
        await runtime.wait_for_shutdown_signal()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("--engine", action="append", required=True)
    args = parser.parse_args()
    runtime.run(serve(args.port, args.engine))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
