"""The shared in-memory store of `serve --workers`: a parent's store, two workers' clients."""

from __future__ import annotations

from pathlib import Path

import pytest

from hiveroute.state.shared import SharedStateClient, StateServer


async def test_two_clients_see_one_store_and_races_have_one_winner(tmp_path: Path) -> None:
    server = StateServer(str(tmp_path / "state.sock"))
    await server.start()
    a, b = SharedStateClient(server.path), SharedStateClient(server.path)
    try:
        assert await a.set_if_absent("wf:home:1", "e1", ttl_s=60)
        assert not await b.set_if_absent("wf:home:1", "e2")
        assert await b.get("wf:home:1") == "e1"
        assert not await b.compare_and_set("wf:home:1", "e2", "e3")
        assert await b.compare_and_set("wf:home:1", "e1", "e3")
        assert await a.get("wf:home:1") == "e3"
        # pipelined increments from both clients: none lost
        import asyncio

        await asyncio.gather(*(c.hincrby("stats", "requests") for c in (a, b) * 50))
        assert await a.hgetall("stats") == {"requests": "100"}
        several = await asyncio.gather(
            *(c.hincrby_many("stats", {"requests": 1, "tokens": 10}) for c in (a, b) * 5)
        )
        assert several[-1] == {"requests": 110, "tokens": 100}  # each call is atomic, in order
        assert await b.hgetall("stats") == {"requests": "110", "tokens": "100"}
        assert await b.push_bounded("order", "r1", 2) == []
        await a.push_bounded("order", "r2", 2)
        assert await b.push_bounded("order", "r3", 2) == ["r1"]
        assert await a.lrange("order") == ["r2", "r3"]
        assert await b.scan("wf:") == ["wf:home:1"]
        assert await a.delete("wf:home:1", "nothing") == 1
        await a.set("text", "x")
        with pytest.raises(TypeError):  # the store's own error, raised in the worker
            await b.hgetall("text")
        with pytest.raises(ValueError):
            await b.push_bounded("order", "r4", 0)
    finally:
        await a.close()
        await b.close()
        await server.stop()


async def test_a_client_whose_server_is_gone_gets_a_connection_error(tmp_path: Path) -> None:
    server = StateServer(str(tmp_path / "state.sock"))
    await server.start()
    client = SharedStateClient(server.path)
    await client.set("k", "v")
    await server.stop()
    with pytest.raises(ConnectionError):
        await client.get("k")
    await client.close()


async def test_the_calls_of_one_turn_travel_in_one_frame_each_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's bookkeeping is a few dozen calls in a few rounds: each round is one frame
    to the server and one back, not one per call."""

    from hiveroute.state import shared
    from hiveroute.state.store import all_of

    frames: list[int] = []
    take_frame = shared._take_frame

    def counting(buffer: bytearray) -> list[object] | None:
        messages = take_frame(buffer)
        if messages is not None:
            frames.append(len(messages))
        return messages

    monkeypatch.setattr(shared, "_take_frame", counting)
    server = StateServer(str(tmp_path / "state.sock"))
    await server.start()
    client = SharedStateClient(server.path)
    try:
        await client.set("warm", "1")  # connects
        frames.clear()
        results = await all_of(
            client,
            *(client.hincrby("stats", f"f{i}", i) for i in range(20)),
            client.hget("stats", "f3"),
            client.get("warm"),
        )
        assert results == [*range(20), "3", "1"]
        assert sorted(frames) == [22, 22]  # the calls in one frame, the replies in another
    finally:
        await client.close()
        await server.stop()


async def test_a_malformed_frame_drops_that_connection_only(tmp_path: Path) -> None:
    import asyncio

    server = StateServer(str(tmp_path / "state.sock"))
    await server.start()
    good = SharedStateClient(server.path)
    try:
        reader, writer = await asyncio.open_unix_connection(server.path)
        payload = b'{"not": "a list"}'
        writer.write(len(payload).to_bytes(4, "big") + payload)
        assert await reader.read() == b""  # the server closed it
        writer.close()
        await good.set("k", "v")
        assert await good.get("k") == "v"
    finally:
        await good.close()
        await server.stop()


async def test_a_frame_that_arrives_in_pieces_is_answered_once_whole(tmp_path: Path) -> None:
    import asyncio

    import orjson

    server = StateServer(str(tmp_path / "state.sock"))
    await server.start()
    try:
        reader, writer = await asyncio.open_unix_connection(server.path)
        payload = orjson.dumps([[1, "set", ["k", "v"], {}], [2, "get", ["k"], {}]])
        for byte in len(payload).to_bytes(4, "big") + payload:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0)
        size = int.from_bytes(await reader.readexactly(4), "big")
        assert orjson.loads(await reader.readexactly(size)) == [[1, True, None], [2, True, "v"]]
        writer.close()
    finally:
        await server.stop()


async def test_a_client_connects_again_after_its_server_came_back(tmp_path: Path) -> None:
    path = str(tmp_path / "state.sock")
    server = StateServer(path)
    await server.start()
    client = SharedStateClient(path)
    try:
        await client.set("k", "v")
        await server.stop()
        with pytest.raises(ConnectionError):
            await client.get("k")
        server = StateServer(path)  # a new store: the old data went with the old server
        await server.start()
        assert await client.get("k") is None
        await client.set("k", "w")
        assert await client.get("k") == "w"
    finally:
        await client.close()
        await server.stop()


def test_a_store_operation_that_suspends_is_refused() -> None:
    import asyncio

    from hiveroute.state.shared import run_now

    async def suspends() -> int:
        await asyncio.sleep(0)
        return 1

    async def returns() -> int:
        return 2

    assert run_now(returns()) == 2
    with pytest.raises(RuntimeError, match="suspended"):
        run_now(suspends())


def test_the_store_is_shared_on_the_event_loop_the_router_runs(tmp_path: Path) -> None:
    """The router runs on uvloop where it is installed (`runtime.run`), whose transports are
    not asyncio's classes: the server and a client must work on it too."""
    from hiveroute import runtime

    async def main() -> list[object]:
        server = StateServer(str(tmp_path / "state.sock"))
        await server.start()
        client = SharedStateClient(server.path)
        try:
            await client.hset("h", {"a": "1"})
            return [await client.hincrby("h", "a", 2), await client.hgetall("h")]
        finally:
            await client.close()
            await server.stop()

    assert runtime.run(main()) == [3, {"a": "3"}]
