"""The APIs the router relays, each as an adapter: what the pipeline asks of an API.

The pipeline is the same for every API; what differs is named here, once per API: how its
usage reads (`usage`), whether the engine must be asked for a streamed usage chunk (chat and
completions; the Responses and Messages streams end with their usage anyway), the prompt the
engine will tokenize (`prompt`), its error shape (`error_json`, `stream_error`) and how an engine's
error body is brought into that shape (`engine_error`). docs/protocols.md is the contract.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hiveroute.errors import HiverouteError, error_body
from hiveroute.gateway.usage import UsageReader, chat_usage, messages_usage, responses_usage
from hiveroute.kvindex.tokenizer import Prompt, Tokenizer, prompt_of
from hiveroute.protocols import anthropic
from hiveroute.protocols.prompts import messages_prompt_text, responses_conversation

PromptReader = Callable[[Tokenizer, dict[str, Any]], Prompt]


@dataclass(frozen=True)
class Api:
    """One API's answers to the pipeline's questions (see the module docstring)."""

    name: str
    usage: UsageReader
    prompt: PromptReader
    ask_stream_usage: bool  # add `stream_options.include_usage` upstream (dropped if not asked)
    error_json: Callable[[HiverouteError], dict[str, Any]]
    stream_error: Callable[[str], bytes]
    engine_error: Callable[[bytes], bytes] | None = None  # rewrite an engine's error body
    # the bytes of a stream's first token event; None: its first chunk is its first token
    first_token: bytes | None = None


def openai_error_json(exc: HiverouteError) -> dict[str, Any]:
    return exc.to_json()


def openai_stream_error(message: str) -> bytes:
    """A well-formed SSE event carrying an OpenAI-style error (the openai client raises on it)."""
    payload = error_body(message, "upstream_error", code="upstream_disconnected")
    return b"data: " + json.dumps(payload).encode() + b"\n\ndata: [DONE]\n\n"


def responses_error_json(exc: HiverouteError) -> dict[str, Any]:
    """OpenAI's shape, the HTTP status in `code` where the router has no code of its own (as
    vLLM answers on /v1/responses)."""
    body = exc.to_json()
    if body["error"]["code"] is None:
        body["error"]["code"] = exc.status
    return body


def responses_stream_error(message: str) -> bytes:
    """The Responses API's `error` event, then the stream ends."""
    payload = {"type": "error", "code": "upstream_disconnected", "message": message, "param": None}
    return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"


def anthropic_error_json(exc: HiverouteError) -> dict[str, Any]:
    return anthropic.error_body(exc.status, exc.message)


def anthropic_stream_error(message: str) -> bytes:
    payload = anthropic.error_body(500, message)
    return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"


def anthropic_engine_error(data: bytes) -> bytes:
    """vLLM answers its request validation on /v1/messages in OpenAI's shape: the same message
    in Anthropic's, so the Anthropic SDK parses it (an Anthropic-shaped body is kept)."""
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError):
        return data
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict) or payload.get("type") == "error":
        return data
    code = error.get("code")
    status = code if isinstance(code, int) else 400
    message = str(error.get("message") or "the engine refused the request")
    return json.dumps(anthropic.error_body(status, message)).encode()


def _responses_prompt(tokenizer: Tokenizer, body: dict[str, Any]) -> Prompt:
    return responses_conversation(tokenizer, body)[1]


def _completion_prompt(path: str) -> PromptReader:
    return lambda tokenizer, body: prompt_of(tokenizer, path, body)


COMPLETIONS = Api(
    "completions",
    chat_usage,
    _completion_prompt("/v1/completions"),
    True,
    openai_error_json,
    openai_stream_error,
)
CHAT = Api(
    "chat",
    chat_usage,
    _completion_prompt("/v1/chat/completions"),
    True,
    openai_error_json,
    openai_stream_error,
)
RESPONSES = Api(
    "responses",
    responses_usage,
    _responses_prompt,
    False,
    responses_error_json,
    responses_stream_error,
    # the event line of any delta (text, a function call's arguments, reasoning, a refusal):
    # the first of them is the first token, whatever the turn makes (a tool call's arguments
    # are its only tokens); data lines never hold a raw newline, so only an event line matches
    first_token=b".delta\ndata:",
)
MESSAGES = Api(
    "messages",
    messages_usage,
    messages_prompt_text,
    False,
    anthropic_error_json,
    anthropic_stream_error,
    anthropic_engine_error,
    first_token=b"content_block_delta",
)

# Which API answers a path's refusals (auth, bad bodies, unknown routes): the longest prefix.
ERROR_SHAPES: tuple[tuple[str, Api], ...] = (
    ("/v1/messages", MESSAGES),
    ("/v1/responses", RESPONSES),
)


def api_of_path(path: str) -> Api:
    """The API whose error shape a refusal on `path` takes (chat's for everything else)."""
    for prefix, api in ERROR_SHAPES:
        if path == prefix or path.startswith(prefix + "/"):
            return api
    return CHAT
