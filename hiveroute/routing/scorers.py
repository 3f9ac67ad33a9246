"""Scorers that need nothing but the pool: load and session affinity."""

from __future__ import annotations

import bisect
import hashlib

from hiveroute.engines.engine import Engine
from hiveroute.routing.base import (
    CycleState,
    RoutingRequest,
    Scorer,
    ScorerCategory,
    load_bound,
)
from hiveroute.routing.policy import REASON_KEY


class LoadScorer(Scorer):
    """Prefers engines with fewer requests in flight (ours now, plus others' last scraped)."""

    name = "load"
    category = ScorerCategory.DISTRIBUTION

    def score(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> dict[str, float]:
        return {e.name: 1.0 / (1.0 + e.load.queue_depth) for e in candidates}


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class ConsistentHashRing:
    """A hash ring with virtual nodes: adding or removing one engine moves few keys."""

    def __init__(self, virtual_nodes: int = 64) -> None:
        self.virtual_nodes = virtual_nodes
        self._members: frozenset[str] = frozenset()
        self._points: list[int] = []
        self._owners: list[str] = []

    def _rebuild(self, members: frozenset[str]) -> None:
        ring = sorted(
            (_hash64(f"{name}#{i}"), name) for name in members for i in range(self.virtual_nodes)
        )
        self._points = [point for point, _ in ring]
        self._owners = [name for _, name in ring]
        self._members = members

    def walk(self, key: str, members: frozenset[str]) -> list[str]:
        """Members in ring order starting at `key`'s position, each once."""
        if members != self._members:
            self._rebuild(members)
        if not self._points:
            return []
        start = bisect.bisect(self._points, _hash64(key)) % len(self._points)
        seen: list[str] = []
        for i in range(len(self._points)):
            owner = self._owners[(start + i) % len(self._points)]
            if owner not in seen:
                seen.append(owner)
                if len(seen) == len(members):
                    break
        return seen


class SessionAffinityScorer(Scorer):
    """Consistent hashing on the session (else workflow) id, with bounded load.

    The key's home is its first engine on the ring whose load stays under
    ``ceil(load_factor × average load)`` (Mirrokni et al., "Consistent Hashing with Bounded
    Loads"), so one hot session cannot pin an overloaded engine. Requests without a key score
    zero everywhere and the policy's load scorer decides.
    """

    name = "session_affinity"
    category = ScorerCategory.AFFINITY

    def __init__(self, load_factor: float = 1.25, virtual_nodes: int = 64) -> None:
        if load_factor < 1.0:
            raise ValueError("load_factor must be at least 1.0")
        self.load_factor = load_factor
        self.ring = ConsistentHashRing(virtual_nodes)

    def score(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> dict[str, float]:
        key = request.metadata.affinity_key
        if key is None:
            state.setdefault(REASON_KEY, "no_session_key")
            return {}
        by_name = {e.name: e for e in candidates}
        order = self.ring.walk(key, frozenset(by_name))
        bound = load_bound(candidates, self.load_factor)
        for rank, name in enumerate(order):
            if by_name[name].load.queue_depth + 1 <= bound:
                state.setdefault(REASON_KEY, "session_home" if rank == 0 else "session_spill")
                return {name: 1.0}
        state.setdefault(REASON_KEY, "session_home")
        return {order[0]: 1.0}
