"""Where each agent, session and request was last served: the engine a subagent's parent holds.

A subagent (Claude Code's Task agents, Codex's sub-threads, a workflow's spawned worker)
names its parent: `parent_agent_id` / `parent_session_id` (an agent or session id) or
`parent_request_id` (a request id). When its prompt starts from the parent's context, the
parent's engine holds that prefix. This map remembers, per agent, session and request id, the
engine its last request went to, the chain of its prompt's block keys (PARENT_BLOCK tokens
each) and when it ended; the placement scorer (workflows/placement.py) reads it: the parent's
engine is expected to hold what the two prompts share, and is preferred among equal costs.
Bounded (the oldest entries go first), per router replica, scoped by tenant.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

from hiveroute.kvindex.blocks import BlockKey
from hiveroute.metadata import RequestMetadata
from hiveroute.workflows.scope import scoped

PARENT_BLOCK = 16  # tokens per block of the remembered chains
MAX_CHAIN = 8192  # blocks remembered of one prompt (131k tokens)
MAX_PARENTS = 4096


@dataclass
class Seen:
    engine: str
    chain: list[BlockKey]
    ended_at: float | None = None  # wall clock


def chain_from_keys(keys: list[BlockKey]) -> list[BlockKey]:
    """A prompt's remembered chain, from its block keys of PARENT_BLOCK tokens (computed once
    per request for routing; keys chain from the start, so the first MAX_CHAIN are the
    chain)."""
    return keys[:MAX_CHAIN]


def common_blocks(a: list[BlockKey], b: list[BlockKey]) -> int:
    """How many leading blocks two chains share: a binary search, since a chained key equal at
    position i means every block before it is equal too."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            low = mid
        else:
            high = mid - 1
    return low


def shared_tokens(a: list[BlockKey], b: list[BlockKey]) -> int:
    """Tokens of the prefix two chains share (whole blocks)."""
    return common_blocks(a, b) * PARENT_BLOCK


class Parents:
    """Bounded map of identity -> Seen (see the module docstring)."""

    def __init__(self, max_entries: int = MAX_PARENTS) -> None:
        self.max_entries = max_entries
        self._seen: collections.OrderedDict[str, Seen] = collections.OrderedDict()

    @staticmethod
    def own_keys(meta: RequestMetadata, request_id: str, tenant: str | None) -> list[str]:
        keys = [f"r:{scoped(tenant, request_id)}"]
        keys += [f"a:{scoped(tenant, v)}" for v in (meta.agent_id, meta.session_id) if v]
        return keys

    @staticmethod
    def parent_keys(meta: RequestMetadata, tenant: str | None) -> list[str]:
        parents = (meta.parent_agent_id, meta.parent_session_id)
        keys = [f"a:{scoped(tenant, v)}" for v in parents if v]
        if meta.parent_request_id:
            keys.append(f"r:{scoped(tenant, meta.parent_request_id)}")
        return keys

    def parent_of(self, meta: RequestMetadata, tenant: str | None) -> Seen | None:
        """The parent's last known placement, if the request names a parent seen here."""
        if not (meta.parent_agent_id or meta.parent_session_id or meta.parent_request_id):
            return None
        for key in self.parent_keys(meta, tenant):
            found = self._seen.get(key)
            if found is not None:
                return found
        return None

    def routed(self, keys: list[str], engine: str, chain: list[BlockKey]) -> None:
        seen = Seen(engine, chain)
        for key in keys:
            self._seen.pop(key, None)
            self._seen[key] = seen
        while len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)

    def ended(self, keys: list[str], engine: str) -> None:
        now = time.time()
        for key in keys:
            found = self._seen.get(key)
            if found is not None and found.engine == engine:
                found.ended_at = now
