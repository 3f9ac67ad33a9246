"""Agentic chat bodies for the router benchmarks: each is one agent's request in a workflow, a long
shared context (the workflow's document, as the system message) and the agent's own message (new
in every request), tagged with workflow and agent headers."""

from __future__ import annotations

import json
import random

WORKFLOWS = 8
AGENTS = 4


def _words(rng: random.Random, n: int) -> str:
    vocab = _VOCAB
    return " ".join(rng.choice(vocab) for _ in range(n))


_VOCAB = [
    "".join(random.Random(i).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3 + i % 7))
    for i in range(5000)
]


def agentic_bodies(words: int, count: int, seed: int = 0) -> list[tuple[bytes, dict[str, str]]]:
    """`count` chat bodies of about `words` words: a workflow's shared context + an agent's own."""
    rng = random.Random(seed + words)
    own = min(300, max(20, words // 10))
    contexts = [_words(rng, words - own) for _ in range(WORKFLOWS)]
    bodies = []
    for i in range(count):
        w, agent = i % WORKFLOWS, (i // WORKFLOWS) % AGENTS
        body = {
            "model": "m",
            "messages": [
                {"role": "system", "content": f"Workflow {w} shared context.\n{contexts[w]}"},
                {"role": "user", "content": f"Agent {agent}, step {i}: {_words(rng, own)}"},
            ],
            "max_tokens": 1,
            "stream": False,
        }
        headers = {
            "Content-Type": "application/json",
            "X-Workflow-Id": f"wf-{w}",
            "X-Agent-Id": f"agent-{w}-{agent}",
            "X-Agent-Role": "executor",
        }
        bodies.append((json.dumps(body).encode(), headers))
    return bodies
