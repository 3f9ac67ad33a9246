"""The control API over real HTTP: shapes, every 4xx, expansion, layout, priorities."""

from typing import Any

import aiohttp

from hiveroute.kvindex.tokenizer import BuiltinTokenizer, prompt_token_ids
from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None
) -> tuple[int, Any]:
    async with http.request(method, url, json=body) as resp:
        return resp.status, await resp.json()


def chat(workflow: str, agent: str, messages: list[Any], **hr: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": messages,
        "max_tokens": 2,
        "hiveroute": {"workflow_id": workflow, "agent_id": agent, **hr},
    }


async def test_workflow_api_shapes_and_errors(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory([e.url for e in fake_engines], policy="round_robin")
    base = r.url
    status, wf = await call(
        http,
        "POST",
        f"{base}/v1/workflows",
        {"id": "w1", "agents": [{"id": "p", "role": "planner"}], "ttl_s": 60},
    )
    assert status == 201 and wf["id"] == "w1" and wf["state"] == "active" and wf["ttl_s"] == 60
    for key in (
        "created_at",
        "last_active_at",
        "home_engine",
        "engines",
        "context_ids",
        "agents",
        "requests",
        "handoffs",
        "totals",
    ):
        assert key in wf
    assert (await call(http, "POST", f"{base}/v1/workflows", {"id": "w1"}))[0] == 409
    for bad in ({"ttl_s": 0}, {"agents": "x"}, {"nope": 1}, {"context_ids": ["missing"]}):
        status, err = await call(http, "POST", f"{base}/v1/workflows", bad)
        assert status == 400 and err["error"]["type"] == "invalid_request_error", bad
    async with http.post(f"{base}/v1/workflows", data=b"{not json") as resp:
        assert resp.status == 400
    assert (await call(http, "GET", f"{base}/v1/workflows/none"))[0] == 404

    status, _ = await call(
        http,
        "POST",
        f"{base}/v1/chat/completions",
        chat("w2", "a", [{"role": "user", "content": "hi"}]),
    )
    assert status == 200
    status, listing = await call(http, "GET", f"{base}/v1/workflows")
    assert status == 200 and listing["object"] == "list"
    summary = {s["id"]: s for s in listing["data"]}
    assert set(summary) == {"w1", "w2"}
    assert summary["w2"]["requests"] == 1 and summary["w2"]["agents"] == 1
    assert set(summary["w2"]) >= {
        "id",
        "state",
        "created_at",
        "last_active_at",
        "agents",
        "requests",
        "home_engine",
    }
    _, w2 = await call(http, "GET", f"{base}/v1/workflows/w2")
    req = w2["requests"][0]
    assert req["status"] == "ok" and req["engine"] in {e.url.split("//")[1] for e in fake_engines}
    assert req["prompt_tokens"] == 10 and req["cached_tokens"] == 4

    assert await call(http, "DELETE", f"{base}/v1/workflows/w2") == (
        200,
        {"id": "w2", "state": "ended"},
    )
    assert (await call(http, "DELETE", f"{base}/v1/workflows/zzz"))[0] == 404
    status, err = await call(
        http,
        "POST",
        f"{base}/v1/chat/completions",
        chat("w2", "a", [{"role": "user", "content": "hi"}]),
    )
    assert status == 409 and "ended" in err["error"]["message"]


async def test_context_api_and_errors(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory([e.url for e in fake_engines], context_max_bytes=100)
    base = r.url
    status, ctx = await call(
        http, "POST", f"{base}/v1/contexts", {"id": "kb", "text": "knowledge base", "name": "KB"}
    )
    assert status == 201
    assert ctx["id"] == "kb" and ctx["workflow_id"] is None and ctx["bytes"] == 14
    assert ctx["tokens"] > 0 and "text" not in ctx
    assert (
        await call(http, "POST", f"{base}/v1/contexts", {"id": "kb", "text": "knowledge base"})
    )[0] == 201
    assert (await call(http, "POST", f"{base}/v1/contexts", {"id": "kb", "text": "other"}))[
        0
    ] == 409
    assert (await call(http, "POST", f"{base}/v1/contexts", {"text": "x" * 101}))[0] == 413
    assert (await call(http, "POST", f"{base}/v1/contexts", {"text": ""}))[0] == 400
    assert (await call(http, "POST", f"{base}/v1/contexts", {"text": "a", "x": 1}))[0] == 400
    status, scoped = await call(
        http, "POST", f"{base}/v1/contexts", {"text": "task", "workflow_id": "w1"}
    )
    assert status == 201 and scoped["workflow_id"] == "w1"
    _, listing = await call(http, "GET", f"{base}/v1/contexts?workflow_id=w1")
    assert [c["id"] for c in listing["data"]] == [scoped["id"]]
    _, full = await call(http, "GET", f"{base}/v1/contexts/kb")
    assert full["text"] == "knowledge base"
    _, wf = await call(http, "GET", f"{base}/v1/workflows/w1")
    assert wf["context_ids"] == [scoped["id"]]
    assert (await call(http, "DELETE", f"{base}/v1/workflows/w1"))[0] == 200
    assert (await call(http, "GET", f"{base}/v1/contexts/{scoped['id']}"))[0] == 404
    assert (await call(http, "DELETE", f"{base}/v1/contexts/kb"))[0] == 200
    assert (await call(http, "GET", f"{base}/v1/contexts/kb"))[0] == 404
    assert (await call(http, "DELETE", f"{base}/v1/contexts/kb"))[0] == 404


async def test_references_expand_and_bad_references_are_refused(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory([fake_engines[0].url])
    base = r.url
    await call(http, "POST", f"{base}/v1/contexts", {"id": "g", "text": "GLOBAL"})
    await call(
        http, "POST", f"{base}/v1/contexts", {"id": "mine", "text": "MINE", "workflow_id": "a"}
    )
    await call(
        http, "POST", f"{base}/v1/contexts", {"id": "theirs", "text": "T", "workflow_id": "b"}
    )
    engine = fake_engines[0]
    body = chat(
        "a",
        "x",
        [
            {"role": "system", "content": "You are x."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "see"}, {"type": "context_ref", "id": "g"}],
            },
        ],
        context_refs=["mine"],
    )
    assert (await call(http, "POST", f"{base}/v1/chat/completions", body))[0] == 200
    sent = engine.received[-1]
    assert "hiveroute" not in sent
    assert sent["messages"][0]["content"] == "MINE\n\nYou are x."  # refs in the order given
    assert sent["messages"][1]["content"] == "see\nGLOBAL"  # inline part replaced in place

    status, err = await call(
        http,
        "POST",
        f"{base}/v1/chat/completions",
        chat("a", "x", [{"role": "user", "content": "q"}], context_refs=["nope"]),
    )
    assert status == 400 and "nope" in err["error"]["message"]
    status, err = await call(
        http,
        "POST",
        f"{base}/v1/chat/completions",
        chat("a", "x", [{"role": "user", "content": "q"}], context_refs=["theirs"]),
    )
    assert status == 403 and "theirs" in err["error"]["message"]
    status, err = await call(
        http,
        "POST",
        f"{base}/v1/chat/completions",
        chat("a", "x", [{"role": "user", "content": [{"type": "context_ref"}]}]),
    )
    assert status == 400
    # completions: the prefix goes before the prompt; token ids cannot take one
    body = {"model": "m", "prompt": "Q", "hiveroute": {"workflow_id": "a", "context_refs": ["g"]}}
    assert (await call(http, "POST", f"{base}/v1/completions", body))[0] == 200
    assert engine.received[-1]["prompt"] == "GLOBAL\n\nQ"
    body["prompt"] = [1, 2, 3]
    assert (await call(http, "POST", f"{base}/v1/completions", body))[0] == 400


async def test_layout_gives_every_agent_the_same_leading_tokens(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    r = await router_factory([fake_engines[0].url])
    base = r.url
    await call(http, "POST", f"{base}/v1/workflows", {"id": "w", "shared_prefix_layout": True})
    await call(
        http,
        "POST",
        f"{base}/v1/contexts",
        {"id": "task", "text": "The task: " * 50, "workflow_id": "w"},
    )
    await call(
        http, "POST", f"{base}/v1/contexts", {"id": "kb", "text": "Fact. " * 80, "workflow_id": "w"}
    )
    await call(http, "POST", f"{base}/v1/contexts", {"id": "glob", "text": "Style guide. " * 20})
    agents = {
        # role first, contexts referenced in different orders and places
        "planner": [
            {"role": "system", "content": "You plan."},
            {
                "role": "user",
                "content": [
                    {"type": "context_ref", "id": "kb"},
                    {"type": "text", "text": "plan it"},
                ],
            },
        ],
        "executor": [
            {"role": "system", "content": "You execute, carefully."},
            {"role": "user", "content": "do step 1"},
        ],
        "validator": [
            {"role": "user", "content": [{"type": "context_ref", "id": "task"}]},
            {"role": "user", "content": "check"},
        ],
    }
    engine = fake_engines[0]
    for agent, messages in agents.items():
        status, _ = await call(
            http,
            "POST",
            f"{base}/v1/chat/completions",
            chat("w", agent, messages, context_refs=["glob"]),
        )
        assert status == 200
    agent_bodies = [b for b in engine.received if b.get("max_tokens") == 2]
    prewarms = [b for b in engine.received if b.get("max_tokens") == 1]
    sent = agent_bodies[-3:]
    shared = "The task: " * 50 + "\n\n" + "Fact. " * 80 + "\n\n" + "Style guide. " * 20
    for body in sent:
        assert body["messages"][0]["role"] == "system"
        assert body["messages"][0]["content"].startswith(shared)
    assert sent[0]["messages"][0]["content"] == shared + "\n\nYou plan."
    assert sent[0]["messages"][1]["content"] == "plan it"  # its inline ref moved to the prefix
    assert [m["content"] for m in sent[2]["messages"][1:]] == ["check"]
    # pre-warm: each registered context prefilled the workflow's prefix so far
    assert prewarms and prewarms[-1]["messages"][0]["content"].startswith("The task: ")
    tok = BuiltinTokenizer()
    ids = [prompt_token_ids(tok, "/v1/chat/completions", b) for b in sent]
    n_shared = len(tok.encode("<s><|system|>\n" + shared, add_special_tokens=False))
    assert ids[0][: n_shared - 1] == ids[1][: n_shared - 1] == ids[2][: n_shared - 1]

    # without the opt-in, the agent's own order is kept
    await call(http, "POST", f"{base}/v1/workflows", {"id": "plain"})
    mine = [
        {"role": "system", "content": "You plan."},
        {"role": "user", "content": [{"type": "context_ref", "id": "glob"}]},
    ]
    status, _ = await call(http, "POST", f"{base}/v1/chat/completions", chat("plain", "p", mine))
    assert status == 200
    body = [b for b in engine.received if b.get("max_tokens") == 2][-1]
    assert body["messages"][0]["content"] == "You plan."
    assert body["messages"][1]["content"].startswith("Style guide. ")
    # a context of workflow w is not for workflow plain
    status, _ = await call(
        http, "POST", f"{base}/v1/chat/completions", chat("plain", "p", agents["planner"])
    )
    assert status == 403


async def test_priorities_follow_attained_service(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    engine.behaviour.usage_for = lambda body: {
        "prompt_tokens": 5000,
        "completion_tokens": 100,
        "total_tokens": 5100,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    r = await router_factory([engine.url], priority_quantum_tokens=1000)
    base = r.url
    await call(http, "POST", f"{base}/v1/workflows", {"id": "long", "priority_scheduling": True})
    msgs = [{"role": "user", "content": "x"}]
    for _ in range(3):
        await call(http, "POST", f"{base}/v1/chat/completions", chat("long", "a", msgs))
    levels = [b["priority"] for b in engine.received]
    assert levels[0] == 0 and levels[0] < levels[1] < levels[2]
    await call(http, "POST", f"{base}/v1/workflows", {"id": "short", "priority_scheduling": True})
    await call(http, "POST", f"{base}/v1/chat/completions", chat("short", "a", msgs))
    assert engine.received[-1]["priority"] == 0  # a new workflow goes first
    await call(http, "POST", f"{base}/v1/chat/completions", chat("off", "a", msgs))
    assert "priority" not in engine.received[-1]  # not opted in
    await call(http, "POST", f"{base}/v1/chat/completions", chat("off", "a", msgs, priority=7))
    assert engine.received[-1]["priority"] == 7  # an explicit priority is passed on
    _, wf = await call(http, "GET", f"{base}/v1/workflows/long")
    assert wf["service_tokens"] == 3 * 5100


async def test_cross_agent_tokens_in_api_and_metrics(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    tok = BuiltinTokenizer()
    seen: list[int] = []

    def usage(body: dict[str, Any]) -> dict[str, Any]:
        n = len(prompt_token_ids(tok, "/v1/chat/completions", body))
        cached = 0 if not seen else 64  # the engine reports the shared prefix cached
        seen.append(n)
        return {
            "prompt_tokens": n,
            "completion_tokens": 1,
            "total_tokens": n + 1,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    engine.behaviour.usage_for = usage
    r = await router_factory([engine.url])
    shared = "shared words " * 40
    for agent in ("planner", "executor-1"):
        await call(
            http,
            "POST",
            f"{r.url}/v1/chat/completions",
            chat("w", agent, [{"role": "system", "content": shared + agent}]),
        )
    _, wf = await call(http, "GET", f"{r.url}/v1/workflows/w")
    assert wf["requests"][0]["cross_agent_cached_tokens"] == 0
    assert wf["requests"][1]["cross_agent_cached_tokens"] == 64
    assert wf["totals"]["cross_agent_cached_tokens"] == 64
    async with http.get(f"{r.url}/metrics") as resp:
        text = await resp.text()
    assert (
        f'hiveroute_cross_agent_cached_tokens_total{{engine="127.0.0.1:{engine.port}"}} 64.0'
        in text
    )


async def test_tenants_have_separate_namespaces(
    fake_engines: list[FakeEngine], router_factory: RouterFactory, http: aiohttp.ClientSession
) -> None:
    keys = {"key-aaaaaaaa": "alpha", "key-bbbbbbbb": "beta"}
    r = await router_factory([fake_engines[0].url], api_keys=keys, admin_key="admin-key-123")
    base = r.url

    async def as_(key: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key}"}
        async with http.request(method, base + path, json=body, headers=headers) as resp:
            return resp.status, await resp.json()

    assert (await call(http, "GET", f"{base}/v1/workflows"))[0] == 401
    assert (await as_("key-aaaaaaaa", "POST", "/v1/workflows", {"id": "w1"}))[0] == 201
    assert (await as_("key-bbbbbbbb", "POST", "/v1/workflows", {"id": "w1"}))[0] == 201
    assert (await as_("key-aaaaaaaa", "POST", "/v1/contexts", {"id": "c", "text": "A"}))[0] == 201
    _, listing = await as_("key-bbbbbbbb", "GET", "/v1/workflows")
    assert [(w["id"], w["tenant"]) for w in listing["data"]] == [("w1", "beta")]
    assert (await as_("key-bbbbbbbb", "GET", "/v1/contexts/c"))[0] == 404
    status, err = await as_(
        "key-bbbbbbbb",
        "POST",
        "/v1/chat/completions",
        chat("w1", "x", [{"role": "user", "content": "q"}], context_refs=["c"]),
    )
    assert status == 400 and "'c'" in err["error"]["message"]
    assert (
        await as_(
            "key-aaaaaaaa",
            "POST",
            "/v1/chat/completions",
            chat("w1", "x", [{"role": "user", "content": "q"}], context_refs=["c"]),
        )
    )[0] == 200
    assert (await as_("key-bbbbbbbb", "DELETE", "/v1/workflows/w1"))[0] == 200
    _, alpha = await as_("key-aaaaaaaa", "GET", "/v1/workflows/w1")
    assert alpha["state"] == "active" and alpha["totals"]["requests"] == 1
    _, everything = await as_("admin-key-123", "GET", "/v1/workflows")
    assert sorted(w["tenant"] for w in everything["data"]) == ["alpha", "beta"]
    _, one = await as_("admin-key-123", "GET", "/v1/workflows/w1?tenant=alpha")
    assert one["tenant"] == "alpha"
