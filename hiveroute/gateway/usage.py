"""Reading `usage` out of engine responses, streamed or not, without parsing every chunk.

Each API names its usage fields its own way; a UsageReader turns one API's `usage` object into
the router's Usage (prompt, cached, completion tokens). Chat and completions are the default.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

TAIL_BYTES = 16 * 1024
USAGE_KEY = b'"usage":'
MAX_USAGE_TRIES = 8  # `"usage":` occurrences looked at, last first (a null one, a quoted one)


@dataclass
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


UsageReader = Callable[[dict[str, Any]], Usage]


def chat_usage(usage: dict[str, Any]) -> Usage:
    """`/v1/completions` and `/v1/chat/completions`: prompt_tokens_details.cached_tokens."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        cached_tokens=_int(cached),
    )


def responses_usage(usage: dict[str, Any]) -> Usage:
    """The Responses API: input_tokens (the whole prompt), input_tokens_details.cached_tokens."""
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=_int(usage.get("input_tokens")),
        completion_tokens=_int(usage.get("output_tokens")),
        cached_tokens=_int(cached),
    )


def messages_usage(usage: dict[str, Any]) -> Usage:
    """The Messages API: the prompt is input_tokens + cache_read_input_tokens +
    cache_creation_input_tokens (Anthropic's rule, which vLLM follows); cached is the read."""
    base = _int(usage.get("input_tokens"))
    read = _int(usage.get("cache_read_input_tokens"))
    created = _int(usage.get("cache_creation_input_tokens"))
    return Usage(
        prompt_tokens=None if base is None else base + (read or 0) + (created or 0),
        completion_tokens=_int(usage.get("output_tokens")),
        cached_tokens=read,
    )


def usage_from_object(payload: Any, reader: UsageReader = chat_usage) -> Usage | None:
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    return reader(usage)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def usage_from_json_bytes(data: bytes, reader: UsageReader = chat_usage) -> Usage | None:
    try:
        return usage_from_object(orjson.loads(data), reader)  # every whole answer: the fast parser
    except (ValueError, RecursionError):
        return None


_DECODER = json.JSONDecoder()


def last_usage(data: bytes, reader: UsageReader = chat_usage) -> Usage | None:
    """The last `usage` object in `data` that gives a prompt size, wherever its event starts.

    Finds the `"usage":` key itself, so an event larger than the tail kept (a Responses
    `response.completed` carries the whole output before its usage) is still read; a key inside
    a JSON string is escaped (`\\"usage\\":`) and skipped."""
    end = len(data)
    for _ in range(MAX_USAGE_TRIES):
        at = data.rfind(USAGE_KEY, 0, end)
        if at < 0:
            return None
        end = at
        if at > 0 and data[at - 1 : at] == b"\\":
            continue
        try:
            value, _ = _DECODER.raw_decode(data[at + len(USAGE_KEY) :].decode().lstrip())
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            found = reader(value)
            if found.prompt_tokens is not None:
                return found
    return None


class StreamTail:
    """Keeps the last chunks of an SSE stream, where the engine puts its usage.

    Runs once per relayed chunk, so it only appends a reference; bytes are joined at the end.
    """

    def __init__(self) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        while self._size - len(self._chunks[0]) >= TAIL_BYTES:
            self._size -= len(self._chunks.popleft())

    def usage(self, reader: UsageReader = chat_usage) -> Usage | None:
        return last_usage(b"".join(self._chunks), reader)
