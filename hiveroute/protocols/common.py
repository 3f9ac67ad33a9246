"""Small checks shared by the API readers: each failure is a 400 naming the field."""

from __future__ import annotations

from typing import Any

from hiveroute.errors import BadRequest

Message = dict[str, Any]

TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


def expect_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"'{where}' must be an object", param=where)
    return value


def expect_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadRequest(f"'{where}' must be a list", param=where)
    return value


def optional_string(body: dict[str, Any], name: str, where: str | None = None) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"'{where or name}' must be a string", param=where or name)
    return value


def text_of_parts(parts: list[Any], where: str) -> str:
    """The text of a list of content parts, joined by newlines as vLLM does for templates that
    take string content (images and other media contribute no text here)."""
    texts: list[str] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            texts.append(part)
            continue
        part = expect_object(part, f"{where}[{i}]")
        kind = part.get("type")
        if kind in TEXT_PART_TYPES:
            text = part.get("text")
            if not isinstance(text, str):
                raise BadRequest(f"'{where}[{i}].text' must be a string", param=where)
            texts.append(text)
        elif not isinstance(kind, str):
            raise BadRequest(f"'{where}[{i}].type' must be a string", param=where)
    return "\n".join(texts)


def optional_int(body: dict[str, Any], name: str, *, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer", param=name)
    if minimum is not None and value < minimum:
        raise BadRequest(f"'{name}' must be at least {minimum}, got {value}", param=name)
    return value


def filled(messages: list[Message]) -> list[Message]:
    """Messages with no content given "" as content, as vLLM renders them (a message of tool
    calls only is an empty string to a template that takes string content)."""
    for message in messages:
        if message.get("content") is None:
            message["content"] = ""
    return messages


def developer_as_system(messages: list[Message], chat_template: str | None) -> list[Message]:
    """vLLM's rendering of the `developer` role for a template that does not name it: each
    becomes a system message, and the system messages are then merged, in order and joined by
    a blank line, into one at the start (when one is not already alone at the start)."""
    if chat_template is None or not any(m.get("role") == "developer" for m in messages):
        return messages
    if '"developer"' in chat_template or "'developer'" in chat_template:
        return messages
    converted = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
    systems = [i for i, m in enumerate(converted) if m.get("role") == "system"]
    if systems in ([], [0]):
        return converted
    texts = [converted[i].get("content") or "" for i in systems]
    merged = {"role": "system", "content": "\n\n".join(t for t in texts if t)}
    return [merged, *(m for m in converted if m.get("role") != "system")]


BILLING_HEADER = "x-anthropic-billing-header"


def without_billing_header(messages: list[Message]) -> list[Message]:
    """vLLM's chat rendering drops, from system messages, text starting with Claude Code's
    per-request attribution header (it would defeat prefix caching), whatever API sent it."""
    out = []
    for m in messages:
        content = m.get("content")
        if (
            m.get("role") == "system"
            and isinstance(content, str)
            and content.startswith(BILLING_HEADER)
        ):
            m = {**m, "content": ""}
        out.append(m)
    return out
