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
