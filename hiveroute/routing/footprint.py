"""Recent KV writes per engine: how fast each engine's prefix cache is turning over.

A request whose prompt no engine holds much of starts a new context: its next turns (or
siblings) will read its blocks again, and writing them evicts older blocks. Sending new contexts
where fewer tokens were written lately keeps every engine's live contexts resident (SGLang's
router gets this by sending unmatched prompts to its smallest tree). Sending them where the
queue is shortest this instant can pile sessions onto one engine until its cache thrashes.

"Lately" is a half-life of FOOTPRINT_HALF_LIFE_S, about as long as an agent session or a
conversation stays live between turns. Writes older than that belong to contexts that are over,
whose blocks are the first evicted anyway. With a one-minute half-life (until 2026-12-01) the
multi-turn benchmark's TTFT p99 was 670-808 ms; with 10 s, 471-506 ms in two runs
(benchmarks/results/kv_routing.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from hiveroute.engines.engine import Engine

# A prompt no engine holds NEW_CONTEXT_SHARE of starts a new context; it may go to an engine
# whose predicted TTFT is up to NEW_CONTEXT_SLACK x the best + NEW_CONTEXT_SLACK_S worse.
NEW_CONTEXT_SHARE = 0.5
NEW_CONTEXT_SLACK = 1.0
NEW_CONTEXT_SLACK_S = 0.02
# Matches this share of the prompt apart count as the same. A follow-up that shares a short
# prefix (a few hundred tokens) with a conversation stays with it: balancing writes is the job of
# the contexts nobody holds. Replaying eight slices of the Mooncake trace through the simulator's
# caches (benchmarks/trace_cache_bound.py, 2026-12-01): 0.02 gave a mean hit rate of 21.75 %, the
# one-cache ideal's, against 21.69 % with 0.1.
SAME_MATCH_SHARE = 0.02
# An engine written less than STARVED_SHARE of the engines' mean lately is starved of new
# contexts: it is offered them even when it holds up to STARVED_MATCH_SHARE of the prompt less.
STARVED_SHARE = 0.5
STARVED_MATCH_SHARE = 0.25
FOOTPRINT_HALF_LIFE_S = 10.0


class KvFootprint:
    """Per engine: uncached prompt tokens routed there, fading with a half-life."""

    def __init__(
        self,
        half_life_s: float = FOOTPRINT_HALF_LIFE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be positive")
        self.half_life_s = half_life_s
        self.clock = clock
        self._by_engine: dict[str, tuple[float, float]] = {}  # engine -> (tokens, as of)

    def of(self, engine: str) -> float:
        """Tokens written to `engine` lately (each counts less as it ages)."""
        found = self._by_engine.get(engine)
        if found is None:
            return 0.0
        tokens, at = found
        return tokens * math.exp2(-(self.clock() - at) / self.half_life_s)

    def add(self, engine: str, tokens: int) -> None:
        if tokens > 0:
            self._by_engine[engine] = (self.of(engine) + tokens, self.clock())


def least_written(
    candidates: list[Engine],
    cost: dict[str, float],
    predicted: dict[str, float],
    cached: dict[str, int],
    n_tokens: int,
    slack_s: float,
    footprint: KvFootprint,
) -> Engine:
    """Where a new context goes: the engine written to least lately, among those whose
    predicted TTFT is within `slack_s` of the best and which hold about as much of the prompt
    as the one the plain ranking (`cost`) would pick (within `SAME_MATCH_SHARE` of the prompt).

    An engine starved of writes (under `STARVED_SHARE` of the mean) is offered new contexts
    even when it holds up to `STARVED_MATCH_SHARE` of the prompt less. Without that, a shared
    prefix (a system prompt) cached on some engines only would keep every new context off the
    others for good: they never get the prefix, because they never get a new context, and the
    engines that do pile up sessions until their caches thrash.
    """
    cheapest = min(candidates, key=lambda e: (cost[e.name], e.name))
    least = cached[cheapest.name] - SAME_MATCH_SHARE * n_tokens
    least_if_starved = cached[cheapest.name] - STARVED_MATCH_SHARE * n_tokens
    limit = min(predicted[e.name] for e in candidates) + slack_s
    written = {e.name: footprint.of(e.name) for e in candidates}
    starved = STARVED_SHARE * sum(written.values()) / len(written)
    eligible = [
        e
        for e in candidates
        if predicted[e.name] <= limit
        and (
            cached[e.name] >= least
            or (written[e.name] < starved and cached[e.name] >= least_if_starved)
        )
    ]
    if not eligible:
        return cheapest
    return min(eligible, key=lambda e: (written[e.name], cost[e.name], e.name))


def new_context_engine(
    candidates: list[Engine],
    cost: dict[str, float],
    predicted: dict[str, float],
    cached: dict[str, int],
    n_tokens: int,
    footprint: KvFootprint,
    *,
    share: float = NEW_CONTEXT_SHARE,
    slack: float = NEW_CONTEXT_SLACK,
    slack_s: float = NEW_CONTEXT_SLACK_S,
) -> Engine | None:
    """Where a prompt goes if it starts a new context (no engine holds `share` of it), else
    None. The rule `kv` and workflow placement share: `least_written` among engines whose
    predicted TTFT is within `slack` x the best + `slack_s` of the best.

    The slack is what lets sessions spread by footprint; narrowing it (to keep long prompts
    out of the TTFT tail, say) sends new sessions where the queue is shortest this instant.
    A multi-turn run with the slack capped at the tail of recent TTFTs (2026-12-01) piled
    sessions onto one engine until its cache thrashed: 83.7 % hit rate, p99 1.1 s."""
    if not n_tokens or max(cached.values()) >= share * n_tokens:
        return None
    best = min(predicted[e.name] for e in candidates)
    return least_written(
        candidates, cost, predicted, cached, n_tokens, slack * best + slack_s, footprint
    )
