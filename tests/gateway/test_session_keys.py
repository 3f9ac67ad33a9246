"""The session keys agents already send, mapped onto hiveroute's metadata (README table).

For each key: what it maps to, the one precedence, that two requests of one session land on one
engine under `session` through the router, and that a bad value is a clear 400.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from hiveroute.errors import BadRequest
from hiveroute.metadata import extract_metadata
from hiveroute.routing.scorers import ConsistentHashRing
from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine

LONG = "x" * 300

# (headers, body, field, value): each key alone.
KEYS: list[tuple[dict[str, str], dict[str, Any], str, Any]] = [
    ({}, {"vllm_xargs": {"agentic_context": {"session_id": "s"}}}, "session_id", "s"),
    ({}, {"vllm_xargs": {"agentic_context": {"task_id": "t"}}}, "workflow_id", "t"),
    ({}, {"vllm_xargs": {"agentic_context": {"agent_id": "a"}}}, "agent_id", "a"),
    ({}, {"vllm_xargs": {"agentic_context": {"program_id": "t:a"}}}, "agent_id", "t:a"),
    ({}, {"vllm_xargs": {"agentic_context": {"agent_role": "lead"}}}, "agent_role", "lead"),
    ({}, {"vllm_xargs": {"agentic_context": {"parent_program_id": "p"}}}, "parent_agent_id", "p"),
    ({}, {"vllm_xargs": {"agentic_context": '{"session_id": 42}'}}, "session_id", "42"),
    ({"X-Dynamo-Session-ID": "d"}, {}, "session_id", "d"),
    ({"X-Dynamo-Parent-Session-ID": "dp"}, {}, "parent_session_id", "dp"),
    ({"x-claude-code-session-id": "c"}, {}, "session_id", "c"),
    ({"x-claude-code-agent-id": "ca"}, {}, "agent_id", "ca"),
    ({"x-claude-code-parent-agent-id": "cp"}, {}, "parent_agent_id", "cp"),
    ({"session-id": "x"}, {}, "session_id", "x"),
    ({"session_id": "x_"}, {}, "session_id", "x_"),
    ({"thread-id": "th"}, {}, "agent_id", "th"),
    ({"x-codex-parent-thread-id": "pt"}, {}, "parent_agent_id", "pt"),
    ({"x-openai-subagent": "review"}, {}, "agent_role", "review"),
    ({"x-session-affinity": "o"}, {}, "session_id", "o"),
    ({"x-opencode-session": "oz"}, {}, "session_id", "oz"),
    ({"x-parent-session-id": "op"}, {}, "parent_session_id", "op"),
    ({"X-Session-ID": "own"}, {}, "session_id", "own"),
    ({"x-user-id": "u"}, {}, "session_id", "u"),
    ({}, {"prompt_cache_key": "pck"}, "session_id", "pck"),
    ({}, {"metadata": {"user_id": "user_1_session_9"}}, "session_id", "user_1_session_9"),
    ({}, {"user": "end-user"}, "session_id", "end-user"),
]


def _meta(headers: dict[str, str], body: dict[str, Any]) -> Any:
    return extract_metadata(body, CIMultiDict(headers))


@pytest.mark.parametrize(("headers", "body", "name", "value"), KEYS)
def test_each_key_maps_onto_its_field(
    headers: dict[str, str], body: dict[str, Any], name: str, value: Any
) -> None:
    meta, _ = _meta(headers, body)
    assert getattr(meta, name) == value


def test_hiveroutes_own_carriers_come_first_then_the_documented_order() -> None:
    body: dict[str, Any] = {
        "vllm_xargs": {"agentic_context": {"session_id": "vllm-router"}},
        "prompt_cache_key": "pck",
        "metadata": {"user_id": "anthropic"},
        "user": "user",
    }
    headers = {
        "X-Dynamo-Session-ID": "dynamo",
        "x-claude-code-session-id": "claude",
        "session-id": "codex",
        "x-session-affinity": "opencode",
        "x-user-id": "x-user-id",
    }
    order = [
        ("vllm-router", lambda b, h: b.pop("vllm_xargs")),
        ("dynamo", lambda b, h: h.pop("X-Dynamo-Session-ID")),
        ("claude", lambda b, h: h.pop("x-claude-code-session-id")),
        ("codex", lambda b, h: h.pop("session-id")),
        ("opencode", lambda b, h: h.pop("x-session-affinity")),
        ("x-user-id", lambda b, h: h.pop("x-user-id")),
        ("pck", lambda b, h: b.pop("prompt_cache_key")),
        ("anthropic", lambda b, h: b.pop("metadata")),
        ("user", lambda b, h: b.pop("user")),
    ]
    # hiveroute's own carriers win over all of them
    assert _meta({**headers, "X-Session-Id": "own"}, body)[0].session_id == "own"
    assert _meta(headers, {**body, "hiveroute": {"session_id": "hr"}})[0].session_id == "hr"
    own = {**body, "metadata": {"session_id": "md", "user_id": "anthropic"}}
    assert _meta(headers, own)[0].session_id == "md"
    for expected, remove in order:
        assert _meta(headers, body)[0].session_id == expected
        remove(body, headers)
    assert _meta(headers, body)[0].session_id is None


def test_agentic_context_is_removed_before_the_engine_and_other_xargs_kept() -> None:
    body = {"model": "m", "vllm_xargs": {"agentic_context": {"session_id": "s"}, "k": 1}}
    meta, clean = _meta({}, body)
    assert meta.session_id == "s" and clean == {"model": "m", "vllm_xargs": {"k": 1}}
    _, clean = _meta({}, {"vllm_xargs": {"agentic_context": {"session_id": "s"}}})
    assert clean == {}
    untouched = {"vllm_xargs": {"k": 1}, "prompt_cache_key": "p"}
    assert _meta({}, untouched)[1] is untouched


BAD: list[tuple[dict[str, str], dict[str, Any], str]] = [
    ({"X-Dynamo-Session-ID": LONG}, {}, "X-Dynamo-Session-ID"),
    ({"X-Dynamo-Parent-Session-ID": LONG}, {}, "X-Dynamo-Parent-Session-ID"),
    ({"x-claude-code-session-id": LONG}, {}, "x-claude-code-session-id"),
    ({"x-claude-code-agent-id": LONG}, {}, "x-claude-code-agent-id"),
    ({"x-claude-code-parent-agent-id": LONG}, {}, "x-claude-code-parent-agent-id"),
    ({"session-id": LONG}, {}, "session-id"),
    ({"session_id": LONG}, {}, "session_id"),
    ({"thread-id": LONG}, {}, "thread-id"),
    ({"x-codex-parent-thread-id": LONG}, {}, "x-codex-parent-thread-id"),
    ({"x-openai-subagent": LONG}, {}, "x-openai-subagent"),
    ({"x-session-affinity": LONG}, {}, "x-session-affinity"),
    ({"x-opencode-session": LONG}, {}, "x-opencode-session"),
    ({"x-parent-session-id": LONG}, {}, "x-parent-session-id"),
    ({"x-user-id": LONG}, {}, "x-user-id"),
    ({}, {"prompt_cache_key": 5}, "prompt_cache_key"),
    ({}, {"prompt_cache_key": LONG}, "prompt_cache_key"),
    ({}, {"metadata": {"user_id": ["u"]}}, "metadata.user_id"),
    ({}, {"metadata": {"user_id": LONG}}, "metadata.user_id"),
    ({}, {"user": {"id": 1}}, "user"),
    ({}, {"user": LONG}, "user"),
    ({}, {"vllm_xargs": {"agentic_context": 5}}, "vllm_xargs.agentic_context"),
    ({}, {"vllm_xargs": {"agentic_context": "{not json"}}, "vllm_xargs.agentic_context"),
    ({}, {"vllm_xargs": {"agentic_context": "[1]"}}, "vllm_xargs.agentic_context"),
    ({}, {"vllm_xargs": {"agentic_context": " " * 17000}}, "vllm_xargs.agentic_context"),
    ({}, {"vllm_xargs": {"agentic_context": {"session_id": []}}}, "agentic_context.session_id"),
    ({}, {"vllm_xargs": {"agentic_context": {"task_id": True}}}, "agentic_context.task_id"),
    ({}, {"vllm_xargs": {"agentic_context": {"agent_id": LONG}}}, "agentic_context.agent_id"),
    ({}, {"vllm_xargs": {"agentic_context": {"priority": "hi"}}}, "agentic_context.priority"),
]


@pytest.mark.parametrize(("headers", "body", "named"), BAD)
def test_bad_values_are_400s_naming_the_key(
    headers: dict[str, str], body: dict[str, Any], named: str
) -> None:
    with pytest.raises(BadRequest) as info:
        _meta(headers, body)
    assert named in info.value.message and info.value.status == 400


# Each new key, as a client sends it: (headers, body fields) for a session called `sid`.
def _carriers(sid: str) -> list[tuple[dict[str, str], dict[str, Any]]]:
    return [
        ({}, {"vllm_xargs": {"agentic_context": {"session_id": sid}}}),
        ({}, {"vllm_xargs": {"agentic_context": json.dumps({"task_id": sid})}}),
        ({"X-Dynamo-Session-ID": sid}, {}),
        ({"x-claude-code-session-id": sid, "x-claude-code-agent-id": "sub-1"}, {}),
        ({"session-id": sid, "thread-id": "t1"}, {}),
        ({"session_id": sid}, {}),
        ({"x-session-affinity": sid, "x-parent-session-id": "p"}, {}),
        ({"x-opencode-session": sid}, {}),
        ({"X-Session-ID": sid}, {}),
        ({"x-user-id": sid}, {}),
        ({}, {"prompt_cache_key": sid}),
        ({}, {"metadata": {"user_id": sid}}),
        ({}, {"user": sid}),
    ]


async def _engine_of(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], fields: dict[str, Any]
) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        return r.headers["X-Hiveroute-Engine"]


@pytest.mark.parametrize("carrier", range(len(_carriers("s"))))
async def test_one_session_lands_on_one_engine_under_session(
    carrier: int,
    fake_engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
) -> None:
    router = await router_factory([e.url for e in fake_engines], policy="session")
    names = frozenset(e.url.removeprefix("http://") for e in fake_engines)
    ring = ConsistentHashRing(64)  # the session policy's own ring: the key decides the engine
    for i in range(6):
        sid = f"session-{i}"
        headers, fields = _carriers(sid)[carrier]
        first = await _engine_of(http, router.url, headers, fields)
        second = await _engine_of(http, router.url, headers, fields)
        assert first == second == ring.walk(sid, names)[0]
    sent = fake_engines[0].received + fake_engines[1].received
    assert all("agentic_context" not in b.get("vllm_xargs", {}) for b in sent)


@pytest.mark.parametrize(("headers", "body", "named"), BAD[::3])
async def test_bad_values_get_a_400_from_the_router(
    headers: dict[str, str],
    body: dict[str, Any],
    named: str,
    fake_engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
) -> None:
    router = await router_factory([e.url for e in fake_engines], policy="session")
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    async with http.post(f"{router.url}/v1/chat/completions", json=ask, headers=headers) as r:
        assert r.status == 400
        error = (await r.json())["error"]
        assert named in error["message"] and error["type"] == "invalid_request_error"
    assert not fake_engines[0].received and not fake_engines[1].received
