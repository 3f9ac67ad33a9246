"""Agentic chat prompts for tokenizer tests."""

from __future__ import annotations


def role_first_messages(
    role: str, context: str, own: str, *, one_message: bool
) -> list[dict[str, str]]:
    """An agent's messages with its own role prompt first, then the workflow's shared context,
    then its own part: `one_message`, the role's instructions and the documents in one system
    message; else each in a message of its own."""
    role_prompt = f"You are the {role}. " + "Follow the plan. " * 3
    if one_message:
        return [
            {"role": "system", "content": role_prompt + "\n" + context},
            {"role": "user", "content": own},
        ]
    return [
        {"role": "system", "content": role_prompt},
        {"role": "user", "content": context},
        {"role": "user", "content": own},
    ]
