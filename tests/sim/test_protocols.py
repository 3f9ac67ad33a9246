"""Responses and Messages requests as the chat messages vLLM 0.32 renders (hiveroute.protocols)."""

from __future__ import annotations

from typing import Any

import pytest

from hiveroute.errors import BadRequest
from hiveroute.protocols import anthropic, responses
from hiveroute.protocols.common import developer_as_system


def test_responses_items_become_chat_messages_as_vllm_builds_them() -> None:
    body: dict[str, Any] = {
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, "b"]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "x"}],
            },
        ],
    }
    previous = [{"role": "system", "content": "old"}, {"role": "user", "content": "before"}]
    out = [{"type": "message", "content": [{"type": "output_text", "text": "earlier answer"}]}]
    messages = responses.conversation_messages(body, previous, responses.output_messages(out))
    assert messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "before"},  # the stored system message is not carried over
        {"role": "assistant", "content": "earlier answer"},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "content": "one", "tool_call_id": "c1"},
        {"role": "assistant", "content": "x"},
    ]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"input": 5},
        {"input": [5]},
        {"input": [{"type": "web_search_call"}]},
        {"input": [{"role": "robot", "content": "x"}]},
        {"input": [{"type": "function_call", "call_id": 1, "name": "f", "arguments": "{}"}]},
        {"input": "x", "instructions": ["no"]},
    ],
)
def test_responses_input_vllm_refuses_is_a_400(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        responses.conversation_messages(body)


def test_developer_role_is_system_for_templates_that_do_not_name_it() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "developer", "content": "d"},
    ]
    assert developer_as_system(messages, "{{ m['role'] }}") == [
        {"role": "system", "content": "s\n\nd"},
        {"role": "user", "content": "u"},
    ]
    assert developer_as_system(messages, "{% if role == 'developer' %}") == messages
    assert developer_as_system(messages, None) == messages


def test_messages_blocks_become_chat_messages_as_vllm_builds_them() -> None:
    body: dict[str, Any] = {
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cch=1;"},
            {"type": "text", "text": "you are "},
            {"type": "text", "text": "a coder", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": "fix it"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "reading"},
                    {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "A"}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [{"type": "text", "text": "B"}],
                    },
                    {"type": "text", "text": "go on"},
                ],
            },
        ],
    }
    assert anthropic.conversation_messages(body) == [
        {"role": "system", "content": "you are a coder"},
        {"role": "user", "content": "fix it"},
        {
            "role": "assistant",
            "content": "reading",
            "reasoning": "hm",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path": "a"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "A"},
        {"role": "tool", "tool_call_id": "t2", "content": "B"},
        {"role": "user", "content": "go on"},
    ]


def test_anthropic_error_types_follow_the_status() -> None:
    assert anthropic.error_body(404, "gone") == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "gone"},
    }
    assert anthropic.error_body(503, "busy")["error"]["type"] == "overloaded_error"
    assert anthropic.error_body(418, "tea")["error"]["type"] == "invalid_request_error"


def test_the_billing_header_never_reaches_the_template() -> None:
    from hiveroute.kvindex.tokenizer import BuiltinTokenizer
    from hiveroute.protocols.prompts import messages_prompt, responses_prompt

    tokenizer = BuiltinTokenizer()
    header = "x-anthropic-billing-header: cc_version=2; cch=abc;"
    plain = messages_prompt(
        tokenizer, {"system": "s", "messages": [{"role": "user", "content": "u"}]}
    )
    with_header = messages_prompt(
        tokenizer,
        {
            "system": [{"type": "text", "text": header}, {"type": "text", "text": "s"}],
            "messages": [{"role": "user", "content": "u"}],
        },
    )
    assert with_header == plain
    _, first = responses_prompt(tokenizer, {"instructions": header, "input": "u"})
    _, second = responses_prompt(tokenizer, {"instructions": header + " other", "input": "u"})
    assert first == second  # the system message is emptied, as vLLM's chat renderer does
