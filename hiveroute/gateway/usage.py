"""Reading `usage` out of engine responses, streamed or not, without parsing every chunk."""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass
from typing import Any

TAIL_BYTES = 16 * 1024


@dataclass
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


def usage_from_object(payload: Any) -> Usage | None:
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        cached_tokens=_int(cached),
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def usage_from_json_bytes(data: bytes) -> Usage | None:
    try:
        return usage_from_object(json.loads(data))
    except (ValueError, RecursionError):
        return None


class StreamTail:
    """Keeps the last chunks of an SSE stream, where vLLM puts its usage chunk.

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

    def usage(self) -> Usage | None:
        tail = b"".join(self._chunks)
        for line in reversed(tail.split(b"\n")):
            line = line.strip()
            if line.startswith(b"data:") and b'"usage"' in line:
                found = usage_from_json_bytes(line[5:].strip())
                if found is not None and found.prompt_tokens is not None:
                    return found
        return None
