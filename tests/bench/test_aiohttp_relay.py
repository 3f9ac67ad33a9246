"""The relay floor (benchmarks.aiohttp_relay) relays bytes both ways and alternates engines:
what `router_cpu` compares the routers with must be a working relay, not an empty server."""

import aiohttp
from aiohttp.test_utils import TestServer

from benchmarks.aiohttp_relay import relay_app
from tests.support.fake_engine import FakeEngine


async def test_the_relay_forwards_bodies_and_streams_to_the_engines_in_turn() -> None:
    engines = [await FakeEngine(f"e{i}").start() for i in range(2)]
    server = TestServer(relay_app([e.url for e in engines]))
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{server.port}/v1/completions"
            for stream in (False, True):
                body = {"model": "m", "prompt": "hello", "max_tokens": 2, "stream": stream}
                async with http.post(url, json=body) as resp:
                    assert resp.status == 200
                    text = await resp.text()
                assert ("data: [DONE]" in text) == stream
        assert [len(e.received) for e in engines] == [1, 1]
        assert engines[1].received[0]["stream"] is True
    finally:
        await server.close()
        for engine in engines:
            await engine.stop()
