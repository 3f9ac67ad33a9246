"""Hostile HTTP input: the router answers 4xx, leaks no stack trace, and keeps serving."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp

from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine


async def raw_exchange(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(65536), timeout=10)
    finally:
        writer.close()


async def test_oversize_headers_garbage_and_absurd_numbers(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    router = await router_factory([fake_engines[0].url])
    huge = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Workflow-Id: "
        + b"a" * 100_000
        + b"\r\n\r\n"
    )
    answer = await raw_exchange(router.port, huge)
    assert re.match(rb"HTTP/1\.[01] 4(00|31) ", answer)
    assert b"Traceback" not in answer

    garbage = await raw_exchange(router.port, b"\x16\x03\x01\x02\x00garbage-not-http\r\n\r\n")
    assert re.match(rb"HTTP/1\.[01] 400 ", garbage) and b"Traceback" not in garbage

    bad_length = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"
    answer = await raw_exchange(router.port, bad_length)
    assert re.match(rb"HTTP/1\.[01] 400 ", answer)

    # Absurd numbers are the engine's to judge; the router passes them through intact.
    body = {"model": "m", "prompt": "p", "max_tokens": 10**30, "temperature": 1e308}
    resp = await http.post(
        f"{router.url}/v1/completions",
        data=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    assert resp.status == 200
    assert fake_engines[0].received[-1]["max_tokens"] == 10**30

    # The router is still healthy after all of that.
    resp = await http.post(f"{router.url}/v1/completions", json={"model": "m", "prompt": "p"})
    assert resp.status == 200


async def test_metadata_header_with_non_ascii_and_control_characters(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    router = await router_factory([fake_engines[0].url])
    resp = await http.post(
        f"{router.url}/v1/completions",
        json={"model": "m", "prompt": "p"},
        headers={"X-Workflow-Id": "wf-é-✓", "baggage": "workflow.id=%ZZ%, agent.id=%E2%9C%93"},
    )
    assert resp.status == 200


def test_malformed_http_is_logged_in_one_line() -> None:
    import logging

    from aiohttp.http_exceptions import LineTooLong

    from hiveroute.gateway.access_log import MalformedHttpFilter

    try:
        raise LineTooLong(b"x" * 10, "8190")
    except LineTooLong as exc:
        record = logging.LogRecord(
            "aiohttp.server",
            logging.ERROR,
            "f",
            1,
            "Error handling request",
            (),
            (type(exc), exc, None),
        )
    assert MalformedHttpFilter().filter(record)
    assert record.exc_info is None and record.levelno == logging.INFO
    assert "8190" in record.getMessage()
