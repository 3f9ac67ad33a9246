"""The text a workflow's prompts share, learned from its requests (for keep-warm)."""

from __future__ import annotations

from typing import Any

MIN_WARM_CHARS = 256


def leading_text(path: str, body: dict[str, Any]) -> str | None:
    """The text a prompt starts with: the first chat message's text, or the completion prompt."""
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[0], dict):
            content = messages[0].get("content")
            return content if isinstance(content, str) else None
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def common_prefix(a: str, b: str) -> str:
    """The longest common prefix, by binary search on slice equality (C speed, O(log n) steps)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return a[:low]
