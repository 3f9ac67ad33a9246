"""A loopback TCP proxy that a test can partition: one client loses a server the others reach.

Modes: "open" relays bytes; "hang" keeps connections open but drops what they carry (a hung
server: the client times out); "refuse" closes every connection (a server that is gone).
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = "open"
        self.port = 0
        self.bytes_from_client = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self._drop_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def set_mode(self, mode: str) -> None:
        assert mode in ("open", "hang", "refuse")
        self.mode = mode
        if mode == "refuse":
            self._drop_all()

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "refuse":
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    if count:
                        self.bytes_from_client += len(data)
                    if self.mode == "hang":  # lost on the way: the other side sees nothing
                        continue
                    if self.mode == "refuse":
                        break
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))
        self._writers.difference_update((writer, up_writer))
