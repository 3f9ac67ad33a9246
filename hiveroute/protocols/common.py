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
