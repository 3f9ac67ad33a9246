"""RouterClient: what it makes of the router's answers, good and bad."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from hiveroute.integrations.router_api import RouterAPIError, RouterClient


@pytest.fixture
async def odd_server() -> AsyncIterator[str]:
    async def refuse(request: web.Request) -> web.Response:
        body = {"error": {"message": "context 'x' is too big", "type": "invalid_request_error"}}
        return web.json_response(body, status=413)

    async def not_json(request: web.Request) -> web.Response:
        return web.Response(text="<html>gateway</html>", status=200)

    async def plain_error(request: web.Request) -> web.Response:
        return web.Response(text="upstream exploded", status=502)

    async def echo(request: web.Request) -> web.Response:
        return web.json_response(
            {"path": request.path, "auth": request.headers.get("Authorization")},
            headers={"X-Request-Id": "hr-1", "X-Hiveroute-Engine": "e9"},
        )

    app = web.Application()
    app.router.add_post("/v1/contexts", refuse)
    app.router.add_get("/v1/contexts/{id}", not_json)
    app.router.add_get("/v1/workflows/{id}", plain_error)
    app.router.add_post("/v1/chat/completions", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_errors_say_what_the_router_answered(odd_server: str) -> None:
    async with RouterClient(odd_server + "/v1/", api_key="k") as client:
        with pytest.raises(RouterAPIError, match="413: context 'x' is too big") as refused:
            await client.create_context("t")
        assert refused.value.status == 413
        with pytest.raises(RouterAPIError, match="not JSON"):
            await client.get_context("x")
        with pytest.raises(RouterAPIError, match="502: upstream exploded"):
            await client.get_workflow("wf")
        answer = await client.chat({"model": "m"})
    assert answer.body == {"path": "/v1/chat/completions", "auth": "Bearer k"}
    assert (answer.request_id, answer.engine) == ("hr-1", "e9")


async def test_unreachable_router() -> None:
    async with RouterClient("http://127.0.0.1:9", connect_timeout_s=2) as client:
        with pytest.raises(RouterAPIError, match="cannot reach the router") as failed:
            await client.models()
    assert failed.value.status is None


def test_bad_url() -> None:
    with pytest.raises(ValueError, match="http://"):
        RouterClient("127.0.0.1:8080")
