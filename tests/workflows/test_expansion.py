"""Shared contexts referenced from every API the router answers.

A Messages or Responses request naming `context_refs` was refused ("shared contexts need a text
prompt"), though the README says any request may list them. The context opens the request's
first system message as the engine renders it: `system` (Messages), `instructions` (Responses).
"""

from __future__ import annotations

from typing import Any

import pytest

from hiveroute.errors import BadRequest
from hiveroute.state import MemoryStateStore
from hiveroute.workflows.contexts import ContextRegistry
from hiveroute.workflows.expansion import SEPARATOR, expand_contexts

KB = "the knowledge base every agent reads"


async def expand(path: str, body: dict[str, Any]) -> dict[str, Any]:
    contexts = ContextRegistry(MemoryStateStore(), lambda text: len(text) // 4)
    await contexts.register({"id": "kb", "text": KB})
    expansion = await expand_contexts(
        body,
        path=path,
        refs=("kb",),
        tenant=None,
        workflow_id=None,
        workflow_context_ids=[],
        layout=False,
        contexts=contexts,
        max_bytes=1 << 20,
    )
    assert expansion is not None and expansion.context_ids == ["kb"]
    return expansion.body


@pytest.mark.parametrize(
    ("system", "expected"),
    [
        (None, KB),
        ("be brief", KB + SEPARATOR + "be brief"),
        ([{"type": "text", "text": "be brief"}], [{"type": "text", "text": KB}, {"type": "text", "text": "be brief"}]),
    ],
)  # fmt: skip
async def test_a_messages_request_gets_the_context_at_the_start_of_its_system(
    system: Any, expected: Any
) -> None:
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    }
    if system is not None:
        body["system"] = system
    expanded = await expand("/v1/messages", body)
    assert expanded["system"] == expected and expanded["messages"] == body["messages"]


@pytest.mark.parametrize(
    ("instructions", "expected"), [(None, KB), ("be brief", KB + SEPARATOR + "be brief")]
)
async def test_a_responses_request_gets_the_context_at_the_start_of_its_instructions(
    instructions: str | None, expected: str
) -> None:
    body: dict[str, Any] = {"model": "m", "input": "hi"}
    if instructions is not None:
        body["instructions"] = instructions
    expanded = await expand("/v1/responses", body)
    assert expanded["instructions"] == expected and expanded["input"] == "hi"


async def test_a_system_of_another_type_is_refused_naming_it() -> None:
    with pytest.raises(BadRequest) as refused:
        await expand("/v1/messages", {"model": "m", "system": 7, "messages": []})
    assert refused.value.param == "system"


async def test_two_registrations_of_one_id_at_once_are_one_context() -> None:
    """Both found the id free; each wrote its own text, the last one won, and both were told
    201: a context is immutable. Now the second is the same again (same text) or a 409."""
    import asyncio

    from hiveroute.errors import Conflict

    class Store(MemoryStateStore):  # a shared store's answer arrives later: stale by then
        async def get(self, key: str) -> str | None:
            value = await super().get(key)
            await asyncio.sleep(0)
            return value

    contexts = ContextRegistry(Store(), lambda text: len(text) // 4)
    same = await asyncio.gather(
        contexts.register({"id": "kb", "text": KB}), contexts.register({"id": "kb", "text": KB})
    )
    assert sorted(created for _, created in same) == [False, True]
    other = ContextRegistry(Store(), lambda text: len(text) // 4)
    results = await asyncio.gather(
        other.register({"id": "kb", "text": KB}),
        other.register({"id": "kb", "text": "another text"}),
        return_exceptions=True,
    )
    assert sorted(type(r).__name__ for r in results) == ["Conflict", "tuple"]
    assert isinstance(next(r for r in results if not isinstance(r, tuple)), Conflict)
    [registered] = [r for r in results if isinstance(r, tuple)]
    assert (await other.get(registered[0].id)).text == registered[0].text  # type: ignore[union-attr]
