"""API keys, tenants, the admin key, and per-tenant cache salts."""

from __future__ import annotations

import aiohttp

from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine

KEYS = {
    "key-tenant-a-000": "tenant-a",
    "key-tenant-a-111": "tenant-a",
    "key-tenant-b-000": "tenant-b",
}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_keys_are_required_and_map_to_tenants(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    router = await router_factory(
        [engine.url], api_keys=KEYS, admin_key="admin-key-000", engine_api_key="engine-secret"
    )
    url = f"{router.url}/v1/completions"
    body = {"model": "m", "prompt": "p", "cache_salt": "chosen-by-client"}
    not_ascii = {"x-api-key": "kéy-tenant-a-000"}  # compare_digest refuses such a str
    for headers in ({}, bearer("wrong-key-0000"), {"Authorization": "Basic abc"}, not_ascii):
        resp = await http.post(url, json=body, headers=headers)
        assert resp.status == 401
        assert "Bearer" in (await resp.json())["error"]["message"]
    assert engine.received == []

    for key in ("key-tenant-a-000", "key-tenant-a-111", "key-tenant-b-000"):
        resp = await http.post(url, json=body, headers=bearer(key))
        assert resp.status == 200
    salts = [seen["cache_salt"] for seen in engine.received]
    assert salts[0] == salts[1]  # agents of one tenant share their cache
    assert salts[2] != salts[0]  # tenants never do
    assert "chosen-by-client" not in salts  # a client cannot pick another tenant's salt
    # The client's key never reaches the engine; the engine's own key does.
    assert {h["Authorization"] for h in engine.received_headers} == {"Bearer engine-secret"}


async def test_open_endpoints_and_admin_only_paths(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    router = await router_factory([fake_engines[0].url], api_keys=KEYS, admin_key="admin-key-000")
    assert (await http.get(f"{router.url}/health")).status == 200
    assert (await http.get(f"{router.url}/metrics")).status == 200
    assert (await http.get(f"{router.url}/v1/models")).status == 401
    assert (
        await http.get(f"{router.url}/v1/models", headers=bearer("key-tenant-b-000"))
    ).status == 200
    tenant = await http.get(f"{router.url}/dashboard", headers=bearer("key-tenant-a-000"))
    assert tenant.status == 403


async def test_without_keys_the_router_is_open_and_forwards_authorization(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    router = await router_factory([engine.url])
    resp = await http.post(
        f"{router.url}/v1/completions",
        json={"model": "m", "prompt": "p"},
        headers=bearer("engine-key"),
    )
    assert resp.status == 200
    assert engine.received_headers[0]["Authorization"] == "Bearer engine-key"
    assert "cache_salt" not in engine.received[0]
