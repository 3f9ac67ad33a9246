"""A request the router refuses leaves nothing behind: no workflow, no slot under max_workflows."""

from typing import Any

import aiohttp

from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None
) -> tuple[int, Any]:
    async with http.request(method, url, json=body) as resp:
        return resp.status, await resp.json()


def ghost(refs: list[str]) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": 2,
        "hiveroute": {"workflow_id": "ghost-wf", "agent_id": "a", "context_refs": refs},
    }


async def test_refused_requests_create_no_workflow(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory([fake_engines[0].url])
    base = r.url
    context = {"id": "theirs", "text": "T", "workflow_id": "other-wf"}
    assert (await call(http, "POST", f"{base}/v1/contexts", context))[0] == 201
    status, err = await call(http, "POST", f"{base}/v1/chat/completions", ghost(["nope"]))
    assert status == 400 and "nope" in err["error"]["message"]
    status, err = await call(http, "POST", f"{base}/v1/chat/completions", ghost(["theirs"]))
    assert status == 403 and "theirs" in err["error"]["message"]
    _, listing = await call(http, "GET", f"{base}/v1/workflows")
    assert "ghost-wf" not in {w["id"] for w in listing["data"]}
    assert (await call(http, "GET", f"{base}/v1/workflows/ghost-wf"))[0] == 404


async def test_refusals_do_not_use_up_max_workflows(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory([fake_engines[0].url], max_workflows=1)
    base = r.url
    for _ in range(3):
        assert (await call(http, "POST", f"{base}/v1/chat/completions", ghost(["nope"])))[0] == 400
    body = ghost([])
    body["hiveroute"]["workflow_id"] = "real-wf"
    assert (await call(http, "POST", f"{base}/v1/chat/completions", body))[0] == 200
    _, listing = await call(http, "GET", f"{base}/v1/workflows")
    assert [(w["id"], w["requests"]) for w in listing["data"]] == [("real-wf", 1)]


async def test_duplicate_context_conflict_names_the_id(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory([fake_engines[0].url])
    base = r.url
    url = f"{base}/v1/contexts"
    assert (await call(http, "POST", url, {"id": "kb", "text": "A", "name": "Base"}))[0] == 201
    status, err = await call(http, "POST", url, {"id": "kb", "text": "B"})
    assert status == 409
    assert err["error"]["message"].startswith("context 'kb' exists")
