"""The prompt an engine tokenizes for a Responses or Messages request, and its token ids.

The simulator tokenizes with these, and a gateway adapter computes the same ids for the KV
index and the cache-aware policies (docs/protocols.md, "The adapter contract").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jinja2

from hiveroute.errors import BadRequest
from hiveroute.kvindex.tokenizer import PromptText, Tokenizer
from hiveroute.protocols import anthropic, responses
from hiveroute.protocols.common import Message, developer_as_system, without_billing_header


def render(
    tokenizer: Tokenizer,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    *,
    add_special_tokens: bool,
) -> PromptText:
    """Chat messages through the model's template, as vLLM renders them before tokenizing (the
    developer role and Claude Code's billing header as its chat renderer treats them); a
    conversation the template refuses is the client's 400."""
    template = getattr(tokenizer, "chat_template", None)
    messages = developer_as_system(messages, template if isinstance(template, str) else None)
    messages = without_billing_header(messages)
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    except (jinja2.TemplateError, TypeError, ValueError) as exc:
        raise BadRequest(f"the chat template cannot render this conversation: {exc}") from None
    return PromptText(text, add_special_tokens=add_special_tokens, chunked=True)


def responses_conversation(
    tokenizer: Tokenizer,
    body: dict[str, Any],
    previous: Sequence[Message] = (),
    previous_output: Sequence[Message] = (),
) -> tuple[list[Message], PromptText]:
    """A Responses request's chat messages (what a stored response keeps for its follow-ups)
    and its prompt. vLLM 0.32 tokenizes these with special tokens: one more BOS than the same
    conversation as a chat."""
    messages = responses.conversation_messages(body, previous, previous_output)
    prompt = render(tokenizer, messages, responses.chat_tools(body), add_special_tokens=True)
    return messages, prompt


def responses_prompt(
    tokenizer: Tokenizer,
    body: dict[str, Any],
    previous: Sequence[Message] = (),
    previous_output: Sequence[Message] = (),
) -> tuple[list[Message], list[int]]:
    """A Responses request's chat messages and its prompt token ids."""
    messages, prompt = responses_conversation(tokenizer, body, previous, previous_output)
    return messages, prompt.encode(tokenizer)


def messages_prompt_text(tokenizer: Tokenizer, body: dict[str, Any]) -> PromptText:
    """A Messages (or count_tokens) request's prompt, rendered as chat."""
    messages = anthropic.conversation_messages(body)
    return render(tokenizer, messages, anthropic.chat_tools(body), add_special_tokens=False)


def messages_prompt(tokenizer: Tokenizer, body: dict[str, Any]) -> list[int]:
    """A Messages (or count_tokens) request's prompt token ids, tokenized as chat."""
    return messages_prompt_text(tokenizer, body).encode(tokenizer)
