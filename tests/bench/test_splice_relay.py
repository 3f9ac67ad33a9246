"""The splice floor (benchmarks.splice_relay) relays whole answers and streams, and keeps its
engine connections: what `relay_chunks` compares the routers with must be a working relay."""

import aiohttp

from benchmarks.splice_relay import BodyEnd, start
from tests.support.fake_engine import FakeEngine


def test_the_end_of_a_chunked_body_is_found_across_any_split() -> None:
    body = b"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked"
    for size in (1, 2, 3, 7, len(body)):
        end = BodyEnd(head)
        pieces = [body[i : i + size] for i in range(0, len(body), size)]
        found = [end.feed(piece) for piece in pieces]
        assert found == [False] * (len(pieces) - 1) + [True], size


def test_the_end_of_a_content_length_body_is_its_last_byte() -> None:
    end = BodyEnd(b"HTTP/1.1 200 OK\r\nContent-Length: 6")
    assert [end.feed(b"abc"), end.feed(b"def")] == [False, True]


async def test_the_relay_forwards_answers_and_streams_to_the_engines_in_turn() -> None:
    engines = [await FakeEngine(f"e{i}").start() for i in range(2)]
    server = await start(0, [e.url for e in engines])
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/v1/completions"
            async with http.get(f"http://127.0.0.1:{port}/health") as resp:
                assert await resp.text() == "ok"
            for stream in (False, True, False, True):  # the same kept connections again
                body = {"model": "m", "prompt": "hello", "max_tokens": 2, "stream": stream}
                async with http.post(url, json=body) as resp:
                    assert resp.status == 200
                    text = await resp.text()
                assert ("data: [DONE]" in text) == stream
        assert [len(e.received) for e in engines] == [2, 2]
        assert [r["stream"] for r in engines[1].received] == [True, True]
    finally:
        server.close()
        for engine in engines:
            await engine.stop()
