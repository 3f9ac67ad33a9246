"""The streamed wire formats of the agent APIs the bench drives besides chat and completions.

Each is a path, a request body, and a reader of the typed SSE events that finds the text, the
end of the stream, errors, the engine's token counts (prompt, cached, completion) and, for the
Responses API, the id a follow-up's `previous_response_id` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hiveroute.bench.records import RequestRecord
from hiveroute.bench.workloads.base import BenchRequest


@dataclass
class EventRead:
    text: str = ""
    done: bool = False
    error: str | None = None
    response_id: str | None = None


class Wire(Protocol):
    endpoint: str
    path: str

    def body(self, request: BenchRequest, model: str, temperature: float) -> dict[str, Any]: ...

    def read(self, kind: str, data: dict[str, Any], record: RequestRecord) -> EventRead: ...


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


class ResponsesWire:
    """`POST /v1/responses` with `stream: true`: `response.output_text.delta` carries text, and
    `response.completed` the usage (`input_tokens`, `input_tokens_details.cached_tokens`)."""

    endpoint = "responses"
    path = "/v1/responses"

    def body(self, request: BenchRequest, model: str, temperature: float) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "input": request.input_items,
            "max_output_tokens": request.max_tokens,
            "stream": True,
            "temperature": temperature,
        }
        if request.instructions is not None:
            body["instructions"] = request.instructions
        if request.previous_response_id is not None:
            body["previous_response_id"] = request.previous_response_id
        return body

    def read(self, kind: str, data: dict[str, Any], record: RequestRecord) -> EventRead:
        if kind == "response.output_text.delta":
            delta = data.get("delta")
            return EventRead(text=delta if isinstance(delta, str) else "")
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            found = data.get("response")
            response: dict[str, Any] = found if isinstance(found, dict) else {}
            usage = response.get("usage")
            if isinstance(usage, dict):
                record.prompt_tokens = _int(usage.get("input_tokens"))
                record.completion_tokens = _int(usage.get("output_tokens"))
                details = usage.get("input_tokens_details")
                if isinstance(details, dict):
                    record.cached_tokens = _int(details.get("cached_tokens"))
            error = _error_text(response["error"]) if response.get("error") else None
            return EventRead(done=True, error=error, response_id=response.get("id"))
        if kind == "error" or data.get("error"):
            return EventRead(error=_error_text(data.get("error") or data.get("message")))
        return EventRead()


class MessagesWire:
    """`POST /v1/messages` with `stream: true`: `content_block_delta` carries text,
    `message_delta` the final usage (vLLM's: `input_tokens` less `cache_read_input_tokens`)."""

    endpoint = "messages"
    path = "/v1/messages"

    def body(self, request: BenchRequest, model: str, temperature: float) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "stream": True,
            "temperature": temperature,
        }
        if request.system is not None:
            body["system"] = request.system
        return body

    def read(self, kind: str, data: dict[str, Any], record: RequestRecord) -> EventRead:
        if kind == "content_block_delta":
            delta = data.get("delta")
            text = delta.get("text") if isinstance(delta, dict) else None
            return EventRead(text=text if isinstance(text, str) else "")
        if kind in ("message_start", "message_delta"):
            source = data.get("message") if kind == "message_start" else data
            usage = source.get("usage") if isinstance(source, dict) else None
            if isinstance(usage, dict):
                cached = _int(usage.get("cache_read_input_tokens")) or 0
                created = _int(usage.get("cache_creation_input_tokens")) or 0
                uncached = _int(usage.get("input_tokens"))
                if uncached is not None and (kind == "message_delta" or cached):
                    record.prompt_tokens = uncached + cached + created
                    record.cached_tokens = cached
                record.completion_tokens = _int(usage.get("output_tokens"))
            return EventRead()
        if kind == "message_stop":
            return EventRead(done=True)
        if kind == "error" or data.get("type") == "error":
            return EventRead(error=_error_text(data.get("error")))
        return EventRead()


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


WIRES: dict[str, Wire] = {"responses": ResponsesWire(), "messages": MessagesWire()}
