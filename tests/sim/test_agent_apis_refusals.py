"""Bad input on the agent APIs: a clear 4xx in the endpoint's own error shape, never a 5xx.

/v1/responses answers in OpenAI's shape (the status as `code` where the router has no code of
its own, as vLLM does there); /v1/messages* in Anthropic's (`{"type": "error", "error": ...}`).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import RouterFactory
from tests.sim.conftest import FleetFactory, urls

GOOD_RESPONSE = {"model": "M", "input": "hi", "max_output_tokens": 2}
GOOD_MESSAGE = {"model": "M", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}

# (path, raw body or a JSON body, expected status, the field the message names)
BAD: list[tuple[str, Any, int, str]] = [
    ("/v1/responses", b"{not json", 400, "not valid JSON"),
    ("/v1/responses", b"[1, 2]", 400, "JSON object"),
    ("/v1/responses", {**GOOD_RESPONSE, "stream": "yes"}, 400, "stream"),
    ("/v1/responses", {**GOOD_RESPONSE, "input": 7}, 400, "input"),
    ("/v1/responses", {**GOOD_RESPONSE, "input": [{"type": "message", "role": "x"}]}, 400, "role"),
    ("/v1/responses", {**GOOD_RESPONSE, "previous_response_id": 3}, 400, "previous_response_id"),
    ("/v1/responses", {**GOOD_RESPONSE, "previous_response_id": "resp_x"}, 404, "resp_x"),
    ("/v1/responses", {**GOOD_RESPONSE, "model": "nope"}, 404, "nope"),
    ("/v1/responses", {**GOOD_RESPONSE, "tools": "all"}, 400, "tools"),
    ("/v1/messages", b"{not json", 400, "not valid JSON"),
    ("/v1/messages", b"", 400, "empty"),
    ("/v1/messages", {**GOOD_MESSAGE, "max_tokens": "2"}, 400, "max_tokens"),
    (
        "/v1/messages",
        {k: v for k, v in GOOD_MESSAGE.items() if k != "max_tokens"},
        400,
        "max_tokens",
    ),
    ("/v1/messages", {**GOOD_MESSAGE, "messages": "hi"}, 400, "messages"),
    ("/v1/messages", {**GOOD_MESSAGE, "system": 5}, 400, "system"),
    ("/v1/messages", {**GOOD_MESSAGE, "system": [{"type": "image"}]}, 400, "system"),
    ("/v1/messages", {**GOOD_MESSAGE, "metadata": {"user_id": 5}}, 400, "user_id"),
    ("/v1/messages", {**GOOD_MESSAGE, "model": "nope"}, 404, "nope"),
    ("/v1/messages/count_tokens", {"model": "M", "messages": 3}, 400, "messages"),
    ("/v1/messages/count_tokens", b"{", 400, "not valid JSON"),
]


def check_shape(path: str, status: int, payload: Any, needle: str) -> None:
    if path.startswith("/v1/messages"):
        assert payload["type"] == "error", payload
        assert payload["error"]["type"] in (
            "invalid_request_error", "not_found_error", "request_too_large",
            "authentication_error",
        )  # fmt: skip
        assert needle in payload["error"]["message"], payload
    else:
        error = payload["error"]
        assert needle in error["message"] or needle == error.get("param"), payload
        assert isinstance(error["code"], (int, str)), payload
        if not isinstance(error["code"], str):
            assert error["code"] == status


@pytest.mark.parametrize(("path", "body", "status", "needle"), BAD)
async def test_bad_input_gets_a_4xx_in_the_endpoints_shape(
    path: str,
    body: Any,
    status: int,
    needle: str,
    sim_fleet: FleetFactory,
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
) -> None:
    fleet = await sim_fleet()
    model = fleet.config.model_name()
    r = await router_factory(urls(fleet))
    if isinstance(body, dict):
        data = aiohttp.JsonPayload(
            {**body, "model": model if body.get("model") == "M" else body.get("model")}
        )
    else:
        data = body
    async with http.post(
        r.url + path, data=data, headers={"Content-Type": "application/json"}
    ) as resp:
        payload = await resp.json()
        assert resp.status == status, payload
    check_shape(path, status, payload, needle)


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages", "/v1/messages/count_tokens"])
async def test_oversize_bodies_and_unknown_routes_are_refused_in_shape(
    path: str,
    sim_fleet: FleetFactory,
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
) -> None:
    fleet = await sim_fleet()
    r = await router_factory(urls(fleet), max_body_bytes=2000)
    async with http.post(r.url + path, data=b'{"input": "' + b"x" * 5000 + b'"}') as resp:
        assert resp.status == 413
        check_shape(path, 413, await resp.json(), "limit")
    async with http.get(r.url + path + "/nothing/here") as resp:
        assert resp.status in (404, 405)
        check_shape(path, resp.status, await resp.json(), "")


async def test_get_and_cancel_of_unknown_ids_and_of_an_unhealthy_engines_ids(
    sim_fleet: FleetFactory, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    model = fleet.config.model_name()
    r = await router_factory(urls(fleet), health_interval_s=60)
    for method, suffix in (("GET", ""), ("POST", "/cancel")):
        async with http.request(method, f"{r.url}/v1/responses/resp_unknown{suffix}") as resp:
            assert resp.status == 404
            error = (await resp.json())["error"]
            assert error["message"] == "Response with id 'resp_unknown' not found."
            assert error["param"] == "response_id"
    async with http.post(
        r.url + "/v1/responses", json={"model": model, "input": "hi", "max_output_tokens": 2}
    ) as resp:
        created = await resp.json()
    [engine] = r.router.pool.engines
    engine.healthy = False
    async with http.get(f"{r.url}/v1/responses/{created['id']}") as resp:
        assert resp.status == 409
        error = (await resp.json())["error"]
        assert error["code"] == "response_engine_unavailable" and engine.name in error["message"]


async def test_an_engines_openai_shaped_refusal_reaches_an_anthropic_client_in_its_shape(
    sim_fleet: FleetFactory, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    model = fleet.config.model_name()
    r = await router_factory(urls(fleet))
    body = {**GOOD_MESSAGE, "model": model, "max_tokens": 10**9}  # over the context: the engine's
    async with http.post(r.url + "/v1/messages", json=body) as resp:
        assert resp.status == 400
        payload = await resp.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"


async def test_one_tenant_cannot_reach_anothers_response(
    sim_fleet: FleetFactory, router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    model = fleet.config.model_name()
    keys = {"sk-tenant-a": "a", "sk-tenant-b": "b"}
    r = await router_factory(urls(fleet), api_keys=keys)
    a = {"Authorization": "Bearer sk-tenant-a"}
    b = {"Authorization": "Bearer sk-tenant-b"}
    body = {"model": model, "input": "hi", "max_output_tokens": 2}
    async with http.post(r.url + "/v1/responses", json=body, headers=a) as resp:
        created = await resp.json()
    async with http.get(f"{r.url}/v1/responses/{created['id']}", headers=a) as resp:
        assert resp.status == 200
    async with http.get(f"{r.url}/v1/responses/{created['id']}", headers=b) as resp:
        assert resp.status == 404
    async with http.get(f"{r.url}/metrics") as resp:  # one bounded label per API, not per id
        text = await resp.text()
    assert 'endpoint="responses"' in text and created["id"] not in text
    follow = {**body, "previous_response_id": created["id"]}
    async with http.post(r.url + "/v1/responses", json=follow, headers=b) as resp:
        assert resp.status == 404
