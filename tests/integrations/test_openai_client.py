"""hiveroute.client: the official openai client, tagged through httpx hooks, against a router."""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor

import httpx2
import openai
import pytest

from hiveroute.client import (
    AsyncOpenAI,
    OpenAI,
    WorkflowTags,
    current_tags,
    tag_client,
    tag_http_client,
    workflow,
)
from tests.integrations.conftest import RecordingRouter
from tests.support.fake_engine import FakeEngine


def sync_client(router: RecordingRouter) -> openai.OpenAI:
    return OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)


def async_client(router: RecordingRouter) -> openai.AsyncOpenAI:
    return AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)


async def test_sync_client_sends_the_block_tags(recording_router: RecordingRouter) -> None:
    client = sync_client(recording_router)

    def calls() -> str | None:
        with workflow("wf-1", agent="planner", role="planner", session="s-1", stage="plan") as wf:
            client.completions.create(model="m", prompt="in-block", max_tokens=2)
            in_block = wf.last_request_id
        client.completions.create(model="m", prompt="outside", max_tokens=2)
        return in_block

    in_block_id = await asyncio.to_thread(calls)
    seen = recording_router.recorder.by_prompt()
    tagged = seen["in-block"]
    assert (tagged.workflow_id, tagged.agent_id, tagged.agent_role) == (
        "wf-1",
        "planner",
        "planner",
    )
    assert (tagged.session_id, tagged.stage) == ("s-1", "plan")
    assert tagged.parent_request_id is None
    assert in_block_id == recording_router.recorder.seen[0][0]
    assert seen["outside"].workflow_id is None and seen["outside"].agent_id is None


async def test_each_answer_becomes_the_next_calls_parent(
    recording_router: RecordingRouter,
) -> None:
    client = async_client(recording_router)
    async with workflow("wf-2", agent="planner", role="planner"):
        await client.completions.create(model="m", prompt="plan", max_tokens=2)
        async with workflow(agent="executor-1", role="executor"):
            await client.completions.create(model="m", prompt="exec", max_tokens=2)
        await client.completions.create(model="m", prompt="review", max_tokens=2)
    ids = {str(body["prompt"]): rid for rid, body, _ in recording_router.recorder.seen}
    seen = recording_router.recorder.by_prompt()
    assert seen["exec"].parent_request_id == ids["plan"]
    assert seen["exec"].workflow_id == "wf-2"  # inherited from the enclosing block
    assert (seen["exec"].agent_id, seen["exec"].agent_role) == ("executor-1", "executor")
    assert seen["review"].parent_request_id == ids["exec"]  # the hand-off back is seen too
    assert seen["review"].agent_id == "planner"


async def test_chain_off_and_explicit_parent(recording_router: RecordingRouter) -> None:
    client = async_client(recording_router)
    async with workflow("wf-3", agent="a", chain=False):
        await client.completions.create(model="m", prompt="one", max_tokens=2)
        await client.completions.create(model="m", prompt="two", max_tokens=2)
    async with workflow("wf-3", agent="b", parent="hr-given"):
        await client.completions.create(model="m", prompt="three", max_tokens=2)
    seen = recording_router.recorder.by_prompt()
    assert seen["two"].parent_request_id is None
    assert seen["three"].parent_request_id == "hr-given"


async def test_concurrent_async_agents_keep_their_own_tags(
    recording_router: RecordingRouter,
) -> None:
    client = async_client(recording_router)

    async def agent(name: str, role: str) -> None:
        async with workflow("wf-c", agent=name, role=role):
            for i in range(4):
                await client.completions.create(model="m", prompt=f"{name}-{i}", max_tokens=2)
                await asyncio.sleep(0)

    await asyncio.gather(
        agent("exec-a", "executor"), agent("exec-b", "executor"), agent("rev", "reviewer")
    )
    seen = recording_router.recorder.by_prompt()
    assert len(seen) == 12
    for prompt, metadata in seen.items():
        assert metadata.agent_id == prompt.rsplit("-", 1)[0]
        assert metadata.workflow_id == "wf-c"
    # each agent's chain stays its own: call i's parent is that agent's call i-1
    ids = {str(body["prompt"]): rid for rid, body, _ in recording_router.recorder.seen}
    for name in ("exec-a", "exec-b", "rev"):
        for i in range(1, 4):
            assert seen[f"{name}-{i}"].parent_request_id == ids[f"{name}-{i - 1}"]


async def test_threads_with_copied_context_keep_their_own_tags(
    recording_router: RecordingRouter,
) -> None:
    client = sync_client(recording_router)

    def agent(name: str) -> None:
        with workflow("wf-t", agent=name):
            for i in range(3):
                client.completions.create(model="m", prompt=f"{name}-{i}", max_tokens=2)

    def run_all() -> None:
        with workflow("wf-t", stage="fanout"), ThreadPoolExecutor(max_workers=3) as pool:
            futures = [
                pool.submit(contextvars.copy_context().run, agent, name)
                for name in ("t0", "t1", "t2")
            ]
            for future in futures:
                future.result(timeout=30)

    await asyncio.to_thread(run_all)
    seen = recording_router.recorder.by_prompt()
    assert len(seen) == 9
    for prompt, metadata in seen.items():
        assert metadata.agent_id == prompt.split("-")[0]
        assert metadata.stage == "fanout"


async def test_streamed_chat_is_tagged_and_chained(recording_router: RecordingRouter) -> None:
    client = async_client(recording_router)
    async with workflow("wf-s", agent="streamer") as wf:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        async for _ in stream:
            pass
        assert wf.last_request_id == recording_router.recorder.seen[-1][0]
    _, _, metadata = recording_router.recorder.seen[-1]
    assert (metadata.workflow_id, metadata.agent_id) == ("wf-s", "streamer")


async def test_caller_headers_win_and_non_ascii_goes_in_baggage(
    recording_router: RecordingRouter,
) -> None:
    client = async_client(recording_router)
    async with workflow("wf-h", agent="plänner", role="planner"):
        await client.completions.create(
            model="m", prompt="p", max_tokens=2, extra_headers={"X-Agent-Role": "boss"}
        )
    _, _, metadata = recording_router.recorder.seen[-1]
    assert metadata.agent_id == "plänner"  # carried by W3C baggage, percent-encoded
    assert metadata.agent_role == "boss"
    assert metadata.workflow_id == "wf-h"


async def test_tag_client_instruments_an_existing_client_once(
    recording_router: RecordingRouter,
) -> None:
    client = openai.AsyncOpenAI(base_url=recording_router.url + "/v1", api_key="unused")
    assert tag_client(client) is client
    tag_client(client)
    hooks = client._client.event_hooks
    assert len(hooks["request"]) == 1 and len(hooks["response"]) == 1
    async with workflow("wf-e", agent="x"):
        await client.completions.create(model="m", prompt="p", max_tokens=2)
    assert recording_router.recorder.seen[-1][2].workflow_id == "wf-e"


def test_tag_http_client_keeps_existing_hooks() -> None:
    def mine(request: httpx2.Request) -> None:
        return None

    http_client = httpx2.Client(event_hooks={"request": [mine]})
    tag_http_client(http_client)
    assert http_client.event_hooks["request"][0] is mine
    assert len(http_client.event_hooks["request"]) == 2


def test_wrong_objects_are_refused() -> None:
    with pytest.raises(TypeError, match=r"openai\.OpenAI"):
        tag_client(object())
    with pytest.raises(TypeError, match="httpx"):
        tag_http_client(object())


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"agent": ""}, "must not be empty"),
        ({"agent": "a\r\nX-Evil: 1"}, "control characters"),
        ({"role": "r" * 300}, "longer than"),
        ({"session": 5}, "must be a string"),
        ({"priority": "high"}, "priority must be an int"),
    ],
)
def test_bad_tags_are_refused(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        workflow("wf", **kwargs)  # type: ignore[arg-type]


def test_current_tags_follow_nesting() -> None:
    assert current_tags() is None
    with workflow("wf", agent="planner", role="planner", priority=5):
        with workflow(agent="exec", stage="run"):
            assert current_tags() == WorkflowTags(
                workflow_id="wf", agent_id="exec", agent_role="planner", stage="run", priority=5
            )
        assert current_tags() == WorkflowTags(
            workflow_id="wf", agent_id="planner", agent_role="planner", priority=5
        )
    assert current_tags() is None


def test_headers_and_baggage() -> None:
    tags = WorkflowTags(workflow_id="wf", agent_id="ä", priority=3)
    assert tags.headers() == {"X-Workflow-Id": "wf", "X-Hiveroute-Priority": "3"}
    assert tags.baggage("k=v") == "k=v,workflow.id=wf,agent.id=%C3%A4"
    assert tags.baggage("agent.id=other") == "agent.id=other,workflow.id=wf"


def test_one_block_object_can_be_entered_again_inside_itself() -> None:
    block = workflow("wf", agent="a")
    with block:
        with workflow(agent="b"), block:
            assert current_tags() == WorkflowTags(workflow_id="wf", agent_id="a")
        assert current_tags() == WorkflowTags(workflow_id="wf", agent_id="a")
    assert current_tags() is None


async def test_callers_baggage_is_kept_and_extended(
    recording_router: RecordingRouter, fake_engines: list[FakeEngine]
) -> None:
    client = async_client(recording_router)
    async with workflow("wf-b", agent="a"):
        await client.completions.create(
            model="m", prompt="p", max_tokens=2, extra_headers={"baggage": "tenant=t1"}
        )
    baggage = [h["baggage"] for e in fake_engines for h in e.received_headers]
    assert baggage == ["tenant=t1,workflow.id=wf-b,agent.id=a"]
