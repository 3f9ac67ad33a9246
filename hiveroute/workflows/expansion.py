"""Expanding shared-context references in a request body.

References: a chat content part ``{"type": "context_ref", "id": ...}`` or ids in
``hiveroute.context_refs``. Without the layout, a part is replaced in place by its text and
``context_refs`` are put at the start of the first system message, in the order given.

With the workflow's `shared_prefix_layout`, every prompt of the workflow starts with the same
bytes: the workflow's own contexts (in registration order), then any other referenced context
(oldest first), joined by a blank line; then the agent's own system prompt and messages. Inline
parts are moved out of their place into that prefix. The prefix goes at the start of the first
system message (one is created if there is none) rather than in a message of its own, because
many chat templates refuse a second system message. The Messages API's `system` and the
Responses API's `instructions` are that first system message as the engine renders them: the
prefix opens them. For completions the prefix is put before the prompt text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hiveroute.errors import BadRequest, Forbidden, PayloadTooLarge
from hiveroute.workflows.contexts import ContextRegistry, SharedContext
from hiveroute.workflows.scope import scoped, unscoped

SEPARATOR = "\n\n"


@dataclass
class Expansion:
    body: dict[str, Any]
    shared_prefix: str | None  # the canonical prefix (layout), for pre-warm and keep-warm
    context_ids: list[str]


def _inline_refs(body: dict[str, Any]) -> list[str]:
    found: list[str] = []
    messages = body.get("messages")
    if not isinstance(messages, list):
        return found
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "context_ref":
                ref = part.get("id")
                if not isinstance(ref, str) or not ref:
                    raise BadRequest(
                        f"messages[{i}].content[{j}]: a context_ref part needs a string 'id'",
                        param="messages",
                    )
                found.append(ref)
    return found


async def _resolve(
    ids: list[str], contexts: ContextRegistry, workflow_id: str | None
) -> dict[str, SharedContext]:
    """Scoped context keys -> contexts; 400 for unknown ids, 403 for another workflow's."""
    resolved: dict[str, SharedContext] = {}
    for key in dict.fromkeys(ids):
        ref = unscoped(key)
        context = await contexts.get(key, required=False)
        if context is None:
            raise BadRequest(
                f"unknown context {ref!r}; register it with POST /v1/contexts first",
                param="context_refs",
                code="context_not_found",
            )
        if context.workflow_id is not None and context.workflow_id != workflow_id:
            raise Forbidden(
                f"context {ref!r} belongs to another workflow; a request may reference only "
                "global contexts and those of its own workflow",
                param="context_refs",
                code="context_forbidden",
            )
        resolved[key] = context
    return resolved


def _collapse(parts: list[Any]) -> Any:
    """Text-only parts become one string (joined with a newline, as vLLM renders them)."""
    if all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
        return "\n".join(str(p.get("text", "")) for p in parts)
    return parts


def _prepend(content: Any, prefix: str) -> Any:
    if content is None or content == "":
        return prefix
    if isinstance(content, str):
        return prefix + SEPARATOR + content
    if isinstance(content, list):
        return _collapse([{"type": "text", "text": prefix}, *content])
    raise BadRequest("message content must be a string or a list of parts", param="messages")


def _with_prefix_message(messages: list[Any], prefix: str) -> list[Any]:
    if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = _prepend(first.get("content"), prefix)
        return [first, *messages[1:]]
    return [{"role": "system", "content": prefix}, *messages]


def _replace_parts(
    messages: list[Any], resolved: dict[str, SharedContext], tenant: str | None, *, inline: bool
) -> list[Any]:
    """Inline refs replaced by their text (inline=True) or removed (moved to the prefix)."""
    result: list[Any] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or not any(
            isinstance(p, dict) and p.get("type") == "context_ref" for p in content
        ):
            result.append(message)
            continue
        parts: list[Any] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "context_ref":
                if inline:
                    parts.append(
                        {"type": "text", "text": resolved[scoped(tenant, part["id"])].text}
                    )
            else:
                parts.append(part)
        if not parts:
            continue  # the message held only references: they moved into the prefix
        result.append({**message, "content": _collapse(parts)})
    return result


def _prefix_prompt(body: dict[str, Any], prefix: str) -> dict[str, Any]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest(
            "shared contexts need a text prompt (one string), not token ids or a batch",
            param="prompt",
        )
    return {**body, "prompt": prefix + SEPARATOR + prompt if prompt else prefix}


def _prefix_field(body: dict[str, Any], name: str, prefix: str, *, blocks: bool) -> dict[str, Any]:
    """The prefix opens `name`: the Messages API's `system` (a string, or text blocks when
    `blocks`), the Responses API's `instructions` (a string)."""
    value = body.get(name)
    if value is None or value == "":
        return {**body, name: prefix}
    if isinstance(value, str):
        return {**body, name: prefix + SEPARATOR + value}
    if blocks and isinstance(value, list):
        return {**body, name: [{"type": "text", "text": prefix}, *value]}
    shapes = "a string or a list of text blocks" if blocks else "a string"
    raise BadRequest(f"'{name}' must be {shapes}", param=name)


def canonical_order(
    resolved: dict[str, SharedContext], workflow_context_ids: list[str]
) -> list[SharedContext]:
    """The workflow's contexts in registration order, then the rest oldest first."""
    rank = {cid: i for i, cid in enumerate(workflow_context_ids)}
    return sorted(
        resolved.values(),
        key=lambda c: (0, rank[c.id], 0.0, "") if c.id in rank else (1, 0, c.created_at, c.id),
    )


def names_contexts(body: dict[str, Any], *, path: str, refs: tuple[str, ...]) -> bool:
    """Whether the request names contexts (`context_refs`, or a chat message's context_ref
    parts): only then can `expand_contexts` refuse it whatever its workflow holds."""
    return bool(refs) or (path.endswith("/chat/completions") and bool(_inline_refs(body)))


async def expand_contexts(
    body: dict[str, Any],
    *,
    path: str,
    refs: tuple[str, ...],
    tenant: str | None,
    workflow_id: str | None,
    workflow_context_ids: list[str],
    layout: bool,
    contexts: ContextRegistry,
    max_bytes: int,
) -> Expansion | None:
    """The body with references expanded, or None when there is nothing to do.

    `refs` and inline ids are as the client wrote them; `workflow_id` and
    `workflow_context_ids` are scoped keys (see scope.py).
    """
    chat = path.endswith("/chat/completions")
    inline = [scoped(tenant, r) for r in _inline_refs(body)] if chat else []
    refs = tuple(scoped(tenant, r) for r in refs)
    auto = workflow_context_ids if layout else []
    wanted = [*auto, *refs, *inline]
    if not wanted:
        return None
    resolved = await _resolve(wanted, contexts, workflow_id)
    total = sum(c.bytes for c in resolved.values())
    if total > max_bytes:
        raise PayloadTooLarge(
            f"the referenced contexts add {total} bytes; the request limit is {max_bytes}"
        )
    if layout:
        ordered = canonical_order(resolved, workflow_context_ids)
    else:
        ordered = [resolved[r] for r in dict.fromkeys(refs)]
    prefix = SEPARATOR.join(c.text for c in ordered) if ordered else None
    if chat:
        messages = body.get("messages")
        assert isinstance(messages, list)
        messages = _replace_parts(messages, resolved, tenant, inline=not layout)
        if prefix is not None:
            messages = _with_prefix_message(messages, prefix)
        new_body = {**body, "messages": messages}
    elif prefix is None:
        new_body = body
    elif path.endswith("/messages"):
        new_body = _prefix_field(body, "system", prefix, blocks=True)
    elif path.endswith("/responses"):
        new_body = _prefix_field(body, "instructions", prefix, blocks=False)
    else:
        new_body = _prefix_prompt(body, prefix)
    return Expansion(
        body=new_body,
        shared_prefix=prefix if layout else None,
        context_ids=[c.id for c in ordered] if layout else list(resolved),
    )
