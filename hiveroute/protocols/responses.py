"""The OpenAI Responses API as vLLM 0.32 reads it: `instructions` and `input` items as chat.

vLLM builds the prompt of `POST /v1/responses` as chat messages: `instructions` as the system
message, then (with `previous_response_id`) the stored conversation of that response without its
system message, then that response's output text as an assistant message, then the new `input`
(a string is one user message; items map one to one, a `function_call` joins the assistant
message before it). The chat template renders them as for `/v1/chat/completions`, so prefix
caching treats a Responses conversation like a chat, with one difference: vLLM 0.32 tokenizes
the rendered text with the tokenizer's special tokens, so the prompt starts with one more BOS
than the same conversation sent to `/v1/chat/completions` (see docs/protocols.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hiveroute.errors import BadRequest
from hiveroute.protocols.common import (
    Message,
    expect_list,
    expect_object,
    filled,
    optional_string,
    text_of_parts,
)

ROLES = frozenset({"user", "assistant", "system", "developer"})


def conversation_messages(
    body: dict[str, Any],
    previous: Sequence[Message] = (),
    previous_output: Sequence[Message] = (),
) -> list[Message]:
    """The chat messages vLLM renders for a Responses request.

    `previous` is the stored input conversation of the `previous_response_id` response and
    `previous_output` its output as chat messages (see `output_messages`); both empty without one.
    """
    messages: list[Message] = []
    instructions = optional_string(body, "instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages.extend(m for m in previous if m.get("role") != "system")
    messages.extend(previous_output)
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
        return filled(messages)
    if raw is None:
        raise BadRequest("'input' is required: a string or a list of input items", param="input")
    for i, item in enumerate(expect_list(raw, "input")):
        message = _item_message(expect_object(item, f"input[{i}]"), i, messages)
        if message is not None:
            messages.append(message)
    return filled(messages)


def _item_message(item: dict[str, Any], i: int, messages: list[Message]) -> Message | None:
    """One input item as a chat message, or None when it joined the assistant message before."""
    where = f"input[{i}]"
    kind = item.get("type")
    last = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
    if kind == "function_call":
        call = {
            "id": _string(item, "call_id", where),
            "type": "function",
            "function": {
                "name": _string(item, "name", where),
                "arguments": _string(item, "arguments", where),
            },
        }
        if last is not None:
            last.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):
            output = text_of_parts(expect_list(output, f"{where}.output"), f"{where}.output")
        return {"role": "tool", "content": output, "tool_call_id": _string(item, "call_id", where)}
    if kind == "reasoning":
        content = item.get("content") or item.get("summary") or []
        parts = expect_list(content, f"{where}.content")
        reasoning = text_of_parts(parts[:1], f"{where}.content")
        if last is not None and last.get("reasoning") is None:
            last["reasoning"] = reasoning
            return None
        return {"role": "assistant", "content": None, "reasoning": reasoning}
    if kind not in (None, "message"):
        raise BadRequest(f"Unsupported input item type: {kind}", param="input")
    role = item.get("role")
    if role not in ROLES:
        raise BadRequest(f"'{where}.role' must be one of {', '.join(sorted(ROLES))}", param="input")
    content = item.get("content")
    if isinstance(content, str):
        text = content
    else:
        parts = expect_list(content, f"{where}.content")
        text = text_of_parts(parts[:1] if role == "assistant" else parts, f"{where}.content")
    if role == "assistant" and last is not None and last.get("content") is None:
        last["content"] = text
        return None
    return {"role": role, "content": text}


def _string(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise BadRequest(f"'{where}.{name}' must be a string", param="input")
    return value


def chat_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's function tools in the chat API's shape (what the chat template sees)."""
    raw = body.get("tools")
    if raw is None:
        return None
    tools = []
    for i, tool in enumerate(expect_list(raw, "tools")):
        tool = expect_object(tool, f"tools[{i}]")
        if tool.get("type") != "function":
            continue  # built-in tools (web search, ...) are not rendered by the template
        name = tool.get("name")
        if not isinstance(name, str):
            raise BadRequest(f"'tools[{i}].name' must be a string", param="tools")
        function: dict[str, Any] = {"name": name}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        if tool.get("parameters") is not None:
            function["parameters"] = tool["parameters"]
        tools.append({"type": "function", "function": function})
    return tools or None


def output_messages(output: Sequence[dict[str, Any]]) -> list[Message]:
    """A response's output items as the assistant messages a follow-up request prepends (vLLM
    carries the text of output messages over; reasoning and tool calls are not)."""
    messages: list[Message] = []
    for item in output:
        if item.get("type") != "message":
            continue
        for part in item.get("content") or []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                messages.append({"role": "assistant", "content": part["text"]})
    return messages
