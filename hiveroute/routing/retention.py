"""How well each engine's cache keeps a context until it comes back, and how often contexts do.

A conversation's next turn, an agent's next step after a tool call: the new prompt extends a
prompt the router routed before. Whether the engine still held that prompt when it came back is
what the router sees at that moment (the KV index, fed by the engine's own events), so it needs
no model of the engine's eviction order: the share of a returning prompt's blocks its last
engine still held is a measurement of that engine's cache under its present load. The same
bookkeeping counts how many requests extend an earlier prompt per request that starts a new
one: the number of times a context is expected to come back.

Both are averages over the recent past (exponentially decayed over the live window), so they
follow the load as it moves. Bookkeeping only: what they mean for a decision is
`routing/cost.py`'s business.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hiveroute.kvindex.blocks import BlockKey
from hiveroute.kvindex.index import PrefixMatch
from hiveroute.routing.live_set import DEFAULT_LIVE_WINDOW_S

# Routed prompts remembered by their last block (a return finds its predecessor among them).
MAX_PROMPTS = 65_536


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a routed prompt went, and how many blocks of it that engine was sent."""

    engine: str
    blocks: int


class Decayed:
    """A sum whose terms fade with a time constant: the recent past's total (at a steady
    rate, rate × the time constant)."""

    __slots__ = ("at", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.at = 0.0

    def read(self, now: float, window_s: float) -> float:
        if self.value and now > self.at:
            self.value *= math.exp(-(now - self.at) / window_s)
        self.at = now
        return self.value

    def add(self, amount: float, now: float, window_s: float) -> None:
        self.value = self.read(now, window_s) + amount


class Retention:
    """Per engine, the share of returning prompts' blocks it still held; for the fleet, how
    many times a context comes back (see the module docstring)."""

    def __init__(
        self,
        window_s: float = DEFAULT_LIVE_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        max_prompts: int = MAX_PROMPTS,
    ) -> None:
        if window_s <= 0:
            raise ValueError("retention window must be positive")
        self.window_s = window_s
        self.clock = clock
        self.max_prompts = max_prompts
        self._ends: OrderedDict[BlockKey, Placed] = OrderedDict()  # last block -> placement
        self._found: dict[str, Decayed] = {}
        self._expected: dict[str, Decayed] = {}
        self._returns = Decayed()
        self._new = Decayed()

    def previous(self, keys: Sequence[BlockKey]) -> Placed | None:
        """The latest routed prompt this one extends (or repeats): its last block is here."""
        ends = self._ends
        if not ends or ends.keys().isdisjoint(keys):  # a new context: one pass, in C
            return None
        for key in reversed(keys):  # a return: its predecessor ended near this one's end
            placed = ends.get(key)
            if placed is not None:
                return placed
        return None

    def observe(self, keys: Sequence[BlockKey], held: Mapping[str, PrefixMatch]) -> None:
        """A prompt of these blocks is being routed; `held` is what each engine was known to
        hold of it (the predecessor's engine among them, if it is still in the pool). Once
        per request: a retry is the same prompt."""
        if not keys:
            return
        now = self.clock()
        before = self.previous(keys)
        if before is None:
            self._new.add(1.0, now, self.window_s)
            return
        self._returns.add(1.0, now, self.window_s)
        match = held.get(before.engine)
        if match is not None:
            self._sample(before.engine, min(match.blocks, before.blocks), before.blocks, now)

    def placed(self, engine: str, keys: Sequence[BlockKey]) -> None:
        """The prompt went to `engine`: its next turn will look for it there."""
        if not keys:
            return
        ends = self._ends
        last = keys[-1]
        ends[last] = Placed(engine, len(keys))
        ends.move_to_end(last)
        while len(ends) > self.max_prompts:
            ends.popitem(last=False)

    def _sample(self, engine: str, found: int, expected: int, now: float) -> None:
        if engine not in self._expected:
            self._found[engine] = Decayed()
            self._expected[engine] = Decayed()
        self._found[engine].add(found, now, self.window_s)
        self._expected[engine].add(expected, now, self.window_s)

    def forget(self, engine: str) -> None:
        """The engine left the pool: what its cache kept says nothing of one that comes back
        under its name."""
        self._found.pop(engine, None)
        self._expected.pop(engine, None)

    def kept(self, engine: str) -> float:
        """The share of returning blocks `engine` still held lately (1 until one came back)."""
        expected = self._expected.get(engine)
        if expected is None:
            return 1.0
        now = self.clock()
        total = expected.read(now, self.window_s)
        if total < 1.0:  # the samples have faded: nothing recent to go by
            return 1.0
        return min(1.0, self._found[engine].read(now, self.window_s) / total)

    def returns_per_context(self) -> float:
        """How many times a context comes back: requests that extended an earlier prompt per
        request that started a new one, lately (one pseudo-count of a new context keeps it
        finite when nothing new arrives)."""
        now = self.clock()
        returns = self._returns.read(now, self.window_s)
        return returns / (self._new.read(now, self.window_s) + 1.0)
