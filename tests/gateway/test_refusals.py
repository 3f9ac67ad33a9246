"""Every response, refusals included, carries X-Request-Id, one access-log line and a count.

A refused request is also finished: a workflow's request refused after its hooks ran (no
engine left) is recorded as an error, not left "running".
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest

from tests.conftest import RouterFactory
from tests.support.access import access_lines, metric_sum
from tests.support.fake_engine import FakeEngine

TENANT_KEY = "key-tenant-a-000"
KEYS = {TENANT_KEY: "tenant-a"}
AUTH = {"Authorization": f"Bearer {TENANT_KEY}"}

# (what is refused, method, path, JSON body or raw bytes, expected status)
CASES: list[tuple[str, str, str, Any, int]] = [
    ("unknown model", "POST", "/v1/completions", {"model": "nope", "prompt": "p"}, 404),
    ("malformed JSON", "POST", "/v1/completions", b"{not json", 400),
    (
        "wrong hiveroute field type",
        "POST",
        "/v1/completions",
        {"model": "m", "prompt": "p", "hiveroute": {"priority": "high"}},
        400,
    ),
    (
        "unknown context_ref",
        "POST",
        "/v1/completions",
        {"model": "m", "prompt": "p", "hiveroute": {"context_refs": ["ghost"]}},
        400,
    ),
    ("missing messages", "POST", "/v1/chat/completions", {"model": "m"}, 400),
    ("admin only", "GET", "/dashboard/api/overview", None, 403),
    ("wrong method", "GET", "/v1/completions", None, 405),
    (
        "context conflict",
        "POST",
        "/v1/contexts",
        {"id": "ctx-1", "text": "another text"},
        409,
    ),
]


def requests_total(text: str) -> float:
    return metric_sum(text, "hiveroute_requests_total")


@pytest.mark.parametrize(
    ("what", "method", "path", "body", "status"), CASES, ids=[c[0] for c in CASES]
)
async def test_a_refusal_is_identified_logged_and_counted(
    what: str,
    method: str,
    path: str,
    body: Any,
    status: int,
    fake_engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hiveroute.access")
    r = await router_factory([fake_engines[0].url], api_keys=KEYS, admin_key="admin-key-000")
    async with http.post(
        f"{r.url}/v1/contexts", json={"id": "ctx-1", "text": "the text"}, headers=AUTH
    ) as resp:
        assert resp.status == 201
    before = requests_total(await (await http.get(f"{r.url}/metrics")).text())
    request_id = f"client-id-{status}"
    headers = {**AUTH, "X-Request-Id": request_id}
    kwargs: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
    async with http.request(method, f"{r.url}{path}", headers=headers, **kwargs) as resp:
        assert resp.status == status, await resp.text()
        assert resp.headers["X-Request-Id"] == request_id
        assert "error" in await resp.json()
    after = requests_total(await (await http.get(f"{r.url}/metrics")).text())
    assert after == before + 1
    lines = access_lines(caplog, request_id)
    assert len(lines) == 1 and lines[0]["status"] == status


async def test_no_engine_left_finishes_the_workflow_request_as_an_error(
    fake_engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hiveroute.access")
    engine = fake_engines[0]
    engine.behaviour.status = 503  # the only engine answers 503: none is left to try
    r = await router_factory([engine.url], policy="workflow")
    body = {"model": "m", "prompt": "p", "hiveroute": {"workflow_id": "wf", "agent_id": "a"}}
    async with http.post(
        f"{r.url}/v1/completions", json=body, headers={"X-Request-Id": "down-1"}
    ) as resp:
        assert resp.status == 503
        assert resp.headers["X-Request-Id"] == "down-1"
    await r.router.workflows.flush()
    async with http.get(f"{r.url}/v1/workflows/wf") as resp:
        workflow = await resp.json()
    statuses = [req["status"] for req in workflow["requests"]]
    assert statuses == ["error_503"]
    text = await (await http.get(f"{r.url}/metrics")).text()
    assert 'hiveroute_requests_total{endpoint="completions",engine="none"' in text
    assert [line["status"] for line in access_lines(caplog, "down-1")] == [503]
