"""The Anthropic Messages API as vLLM 0.32 reads it: `system` and `messages` as chat.

vLLM turns `POST /v1/messages` into a chat request: the `system` field (a string, or text blocks
concatenated without a separator, Claude Code's per-request `x-anthropic-billing-header` block
left out) becomes the system message; each message keeps its role; text blocks become its
content, `tool_use` blocks its tool calls, and each `tool_result` block in a user message becomes
a `tool` message of its own, placed before what remains of that user message. Errors go back as
`{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import json
from typing import Any

from hiveroute.errors import BadRequest
from hiveroute.protocols.common import (
    BILLING_HEADER,
    Message,
    expect_list,
    expect_object,
    filled,
    text_of_parts,
)

ROLES = frozenset({"user", "assistant", "system"})

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str, error_type: str | None = None) -> dict[str, Any]:
    """Anthropic's error shape; the type follows the status unless given."""
    kind = error_type or ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    return {"type": "error", "error": {"type": kind, "message": message}}


def system_text(body: dict[str, Any]) -> str | None:
    system = body.get("system")
    if system is None or system == "":
        return None
    if isinstance(system, str):
        return system
    parts = []
    for i, block in enumerate(expect_list(system, "system")):
        block = expect_object(block, f"system[{i}]")
        text = block.get("text")
        if block.get("type") != "text" or not isinstance(text, str):
            raise BadRequest(f"'system[{i}]' must be a text block", param="system")
        if text and not text.startswith(BILLING_HEADER):
            parts.append(text)
    return "".join(parts) or None


def conversation_messages(body: dict[str, Any]) -> list[Message]:
    """The chat messages vLLM renders for a Messages (or count_tokens) request."""
    messages: list[Message] = []
    system = system_text(body)
    if system:
        messages.append({"role": "system", "content": system})
    raw = body.get("messages")
    if raw is None:
        raise BadRequest("'messages' is required", param="messages")
    for i, item in enumerate(expect_list(raw, "messages")):
        item = expect_object(item, f"messages[{i}]")
        role = item.get("role")
        if role not in ROLES:
            raise BadRequest(
                f"'messages[{i}].role' must be one of {', '.join(sorted(ROLES))}",
                param="messages",
            )
        content = item.get("content")
        if isinstance(content, str):
            if role != "system" or (content and not content.startswith(BILLING_HEADER)):
                messages.append({"role": role, "content": content})
            continue
        blocks = expect_list(content, f"messages[{i}].content")
        message = _blocks_message(role, blocks, f"messages[{i}].content", messages)
        if message is not None:
            messages.append(message)
    return filled(messages)


def _blocks_message(
    role: str, blocks: list[Any], where: str, messages: list[Message]
) -> Message | None:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, block in enumerate(blocks):
        block = expect_object(block, f"{where}[{i}]")
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise BadRequest(f"'{where}[{i}].text' must be a string", param="messages")
            if text and not (role == "system" and text.startswith(BILLING_HEADER)):
                texts.append(text)
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            arguments = block.get("input") or {}
            if not isinstance(arguments, dict):
                raise BadRequest(f"'{where}[{i}].input' must be an object", param="messages")
            calls.append(
                {
                    "id": str(block.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name") or ""),
                        "arguments": json.dumps(arguments),
                    },
                }
            )
        elif kind == "tool_result":
            result = block.get("content")
            if role == "user":
                text = result if isinstance(result, str) else _result_text(result, where, i)
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(block.get("tool_use_id") or ""),
                        "content": text,
                    }
                )
            else:
                texts.append(f"Tool result: {result if result else ''}")
        elif not isinstance(kind, str):
            raise BadRequest(f"'{where}[{i}].type' must be a string", param="messages")
    if role == "system":
        return {"role": "system", "content": "".join(texts)} if texts else None
    message: Message = {"role": role, "content": None}
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if texts:
        message["content"] = "\n".join(texts)
    if role == "user" and message["content"] is None:
        return None
    if role == "assistant" and len(message) == 2 and message["content"] is None:
        return None
    return message


def _result_text(result: Any, where: str, i: int) -> str:
    if result is None:
        return ""
    parts = [p for p in expect_list(result, f"{where}[{i}].content") if isinstance(p, dict)]
    return text_of_parts([p for p in parts if p.get("type") == "text"], f"{where}[{i}].content")


def chat_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's tools in the chat API's shape (what the chat template sees)."""
    raw = body.get("tools")
    if raw is None:
        return None
    tools = []
    for i, tool in enumerate(expect_list(raw, "tools")):
        tool = expect_object(tool, f"tools[{i}]")
        name = tool.get("name")
        if not isinstance(name, str):
            raise BadRequest(f"'tools[{i}].name' must be a string", param="tools")
        function: dict[str, Any] = {"name": name, "parameters": tool.get("input_schema") or {}}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        tools.append({"type": "function", "function": function})
    return tools or None


CACHE_TTLS_S = {"5m": 300.0, "1h": 3600.0}


def cache_control_prefix(body: dict[str, Any]) -> tuple[dict[str, Any], float] | None:
    """The prefix a request marks for reuse, as a one-token Messages request, and its TTL.

    Anthropic caches the prompt up to the last block with `cache_control` (tools, then
    `system`, then `messages`), for its `ttl` ("5m", the default, or "1h"). The returned body
    renders that prefix (a placeholder user turn ends a prefix that stops in `system` or
    `tools`): sent with max_tokens=1 it refreshes the prefix's blocks on an engine. None when
    no block has `cache_control`."""
    last: tuple[str, int, int] | None = None
    ttl = "5m"
    for i, tool in enumerate(body.get("tools") or []):
        if isinstance(tool, dict) and isinstance(tool.get("cache_control"), dict):
            last, ttl = ("tools", i, 0), str(tool["cache_control"].get("ttl") or "5m")
    system = body.get("system")
    if isinstance(system, list):
        for i, block in enumerate(system):
            if isinstance(block, dict) and isinstance(block.get("cache_control"), dict):
                last, ttl = ("system", i, 0), str(block["cache_control"].get("ttl") or "5m")
    messages = body.get("messages")
    if isinstance(messages, list):
        for j, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            for k, block in enumerate(content if isinstance(content, list) else []):
                if isinstance(block, dict) and isinstance(block.get("cache_control"), dict):
                    last, ttl = ("messages", j, k), str(block["cache_control"].get("ttl") or "5m")
    if last is None:
        return None
    where, i, k = last
    placeholder = [{"role": "user", "content": "."}]
    prefix: dict[str, Any] = {"model": body.get("model"), "max_tokens": 1}
    if body.get("tools"):
        prefix["tools"] = body["tools"]
    if where == "system":
        prefix["system"] = system[: i + 1]  # type: ignore[index]
        prefix["messages"] = placeholder
    elif where == "tools":
        prefix["messages"] = placeholder
    else:
        if system is not None:
            prefix["system"] = system
        head = messages[:i]  # type: ignore[index]
        message = messages[i]  # type: ignore[index]
        prefix["messages"] = [*head, {**message, "content": message["content"][: k + 1]}]
    return prefix, CACHE_TTLS_S.get(ttl, CACHE_TTLS_S["5m"])
