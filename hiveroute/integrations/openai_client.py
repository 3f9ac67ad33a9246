"""Make the official `openai` client tag its calls with the current `workflow(...)` block.

Tagging happens in httpx event hooks on the client's HTTP client, so every API call (chat,
completions, streamed or not, retried or not) picks up the tags of the block it was made in.
Headers the caller sets itself (`extra_headers=`) are never overwritten.

The one-line change: `from hiveroute.client import OpenAI` instead of `from openai import OpenAI`
(or `tag_client(existing_client)`).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

from hiveroute.extras import require
from hiveroute.integrations.tags import current_tags, record_request_id

if TYPE_CHECKING:
    import openai


class _Message(Protocol):
    headers: MutableMapping[str, str]


class _Answer(Protocol):
    headers: MutableMapping[str, str]
    status_code: int


def apply_tags(request: _Message) -> None:
    """Set the current block's headers on an outgoing request (caller-set headers win).

    Tags are merged into a baggage header the caller already sends (its own keys kept).
    """
    tags = current_tags()
    if tags is None:
        return
    wanted = tags.outgoing_headers(request.headers.get("baggage"))
    for name, value in wanted.items():
        if name == "baggage" or name not in request.headers:
            request.headers[name] = value


def note_answer(response: _Answer) -> None:
    """Remember a successful answer's X-Request-Id as the next call's parent."""
    if response.status_code < 400:
        request_id = response.headers.get("x-request-id")
        if request_id:
            record_request_id(request_id)


def _sync_request_hook(request: _Message) -> None:
    apply_tags(request)


def _sync_response_hook(response: _Answer) -> None:
    note_answer(response)


async def _async_request_hook(request: _Message) -> None:
    apply_tags(request)


async def _async_response_hook(response: _Answer) -> None:
    note_answer(response)


def _is_async(http_client: Any) -> bool:
    return hasattr(http_client, "aclose") and not hasattr(http_client, "close")


def tag_http_client(http_client: Any) -> Any:
    """Install the tagging hooks on an httpx (or httpx2) Client/AsyncClient; idempotent."""
    hooks = getattr(http_client, "event_hooks", None)
    if not isinstance(hooks, dict):
        raise TypeError(
            f"expected an httpx Client or AsyncClient, got {type(http_client).__name__}"
        )
    if _is_async(http_client):
        request_hook: Any = _async_request_hook
        response_hook: Any = _async_response_hook
    else:
        request_hook, response_hook = _sync_request_hook, _sync_response_hook
    request_hooks = list(hooks.get("request", []))
    response_hooks = list(hooks.get("response", []))
    if request_hook not in request_hooks:
        request_hooks.append(request_hook)
    if response_hook not in response_hooks:
        response_hooks.append(response_hook)
    http_client.event_hooks = {**hooks, "request": request_hooks, "response": response_hooks}
    return http_client


def tag_client(client: Any) -> Any:
    """Make an existing `openai.OpenAI` / `openai.AsyncOpenAI` tag its calls; returns it."""
    http_client = getattr(client, "_client", None)
    if http_client is None or not hasattr(client, "with_options"):
        raise TypeError(f"expected an openai.OpenAI or openai.AsyncOpenAI, got {type(client)}")
    tag_http_client(http_client)
    return client


def OpenAI(**kwargs: Any) -> openai.OpenAI:
    """`openai.OpenAI(**kwargs)` whose calls carry the current workflow block's tags."""
    openai = require("openai", "openai")

    if kwargs.get("http_client") is None:
        kwargs["http_client"] = openai.DefaultHttpxClient()
    tag_http_client(kwargs["http_client"])
    return openai.OpenAI(**kwargs)


def AsyncOpenAI(**kwargs: Any) -> openai.AsyncOpenAI:
    """`openai.AsyncOpenAI(**kwargs)` whose calls carry the current workflow block's tags."""
    openai = require("openai", "openai")

    if kwargs.get("http_client") is None:
        kwargs["http_client"] = openai.DefaultAsyncHttpxClient()
    tag_http_client(kwargs["http_client"])
    return openai.AsyncOpenAI(**kwargs)
