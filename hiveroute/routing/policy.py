"""A policy: filters, weighted scorers and a picker, run as one routing cycle."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from hiveroute.engines.engine import Engine
from hiveroute.errors import NoEngineAvailable
from hiveroute.routing.base import (
    CycleState,
    Decision,
    Filter,
    Picker,
    Plugin,
    RequestOutcome,
    RoutingRequest,
    Scorer,
    StateKey,
)

REASON_KEY: StateKey[str] = StateKey("reason")  # why the cycle chose as it did
# the reason the plugins' `prepare` gave, if any, kept for the attempts after the first
_PREPARED_REASON_KEY: StateKey[str | None] = StateKey("prepared_reason")

log = logging.getLogger("hiveroute.routing")


@dataclass
class WeightedScorer:
    scorer: Scorer
    weight: float = 1.0


class Policy:
    """Runs one routing cycle. Plugins record why they decided under `REASON_KEY`."""

    def __init__(
        self,
        name: str,
        *,
        filters: Sequence[Filter] = (),
        scorers: Sequence[WeightedScorer] = (),
        picker: Picker,
        default_reason: str = "best_score",
    ) -> None:
        self.name = name
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker
        self.default_reason = default_reason
        # requests decided by `decide_then_send` whose plugins have not heard `on_routed` yet
        self._behind: list[tuple[RoutingRequest, Engine, CycleState]] = []

    @property
    def plugins(self) -> list[Plugin]:
        return [*self.filters, *(w.scorer for w in self.scorers), self.picker]

    async def prepare(self, request: RoutingRequest, state: CycleState) -> None:
        self.catch_up()
        for plugin in self.plugins:
            await plugin.prepare(request, state)

    def choose(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> Decision:
        if not candidates:
            raise NoEngineAvailable("no healthy engine can serve this request; try again shortly")
        # every attempt (a retry elsewhere too) says why it chose: only a reason `prepare`
        # gave outlives an attempt
        if _PREPARED_REASON_KEY in state:
            prepared = state[_PREPARED_REASON_KEY]
            if prepared is None:
                state.pop(REASON_KEY)
            else:
                state[REASON_KEY] = prepared
        else:
            state[_PREPARED_REASON_KEY] = state.get(REASON_KEY)
        remaining = candidates
        for f in self.filters:
            remaining = f.filter(request, remaining, state)
            if not remaining:
                raise NoEngineAvailable(
                    f"no engine passed the {f.name!r} filter of policy {self.name!r}"
                )
        totals = {e.name: 0.0 for e in remaining}
        for weighted in self.scorers:
            if weighted.weight == 0:
                continue
            scores = weighted.scorer.score(request, remaining, state)
            for name in totals:
                totals[name] += weighted.weight * scores.get(name, 0.0)
        ranked = sorted(remaining, key=lambda e: totals[e.name], reverse=True)
        engine = self.picker.pick(request, [(e, totals[e.name]) for e in ranked], state)
        return Decision(
            engine=engine, reason=state.get(REASON_KEY, self.default_reason), scores=totals
        )

    def decide(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> Decision:
        """One attempt: choose, then tell every plugin where the request goes (`on_routed`)."""
        self.catch_up()
        decision = self.choose(request, candidates, state)
        self.on_routed(request, decision.engine, state)
        return decision

    def decide_then_send(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> Decision:
        """`decide` for a request the caller sends at once: the plugins hear `on_routed` after
        its bytes are on their way (two event-loop turns later: aiohttp writes a request on
        the turn after it is sent), or before the policy prepares or decides another request
        (or hears this one's first token or end), whichever comes first. What they do then
        (speculating the prompt's blocks, the prefill ledger, the workflow's engines) serves
        later decisions only, so this request does not wait for it, and no later decision
        misses it. By then the engine counts the request in flight: the TTFT ledger learns
        against the load the decision's price read (`EngineCost.load`), not the load then."""
        self.catch_up()
        decision = self.choose(request, candidates, state)
        self._behind.append((request, decision.engine, state))
        if len(self._behind) == 1:
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self.catch_up)
        return decision

    def catch_up(self) -> None:
        """Tell the plugins where the requests `decide_then_send` left behind went, in order.
        A plugin's failure is logged, not raised: the request it concerns is on its way."""
        while self._behind:
            behind, self._behind = self._behind, []
            for request, engine, state in behind:
                try:
                    self.on_routed(request, engine, state)
                except Exception:
                    log.exception("policy %s: on_routed failed for %s", self.name, engine.name)

    def _catch_up_with(self, state: CycleState) -> None:
        """Catch up only if the request of `state` is still behind: its first token or its end
        must follow its own `on_routed`, but need not wait for its siblings' (a burst's first
        answer would otherwise carry the bookkeeping of every request decided since)."""
        if any(pending is state for _, _, pending in self._behind):
            self.catch_up()

    async def route(
        self, request: RoutingRequest, candidates: list[Engine]
    ) -> tuple[Decision, CycleState]:
        """A whole cycle for one attempt (prepare, choose, on_routed), as the request pipeline
        runs it; how a test drives a policy without HTTP or a router."""
        state = CycleState()
        await self.prepare(request, state)
        return self.decide(request, candidates, state), state

    def on_routed(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        for plugin in self.plugins:
            plugin.on_routed(request, engine, state)

    def on_first_token(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        """Every plugin hears the first token, even when one before it fails (logged): the
        request is being served, and a plugin that missed it would keep its prefill counted
        on the engine."""
        self._catch_up_with(state)
        for plugin in self.plugins:
            try:
                plugin.on_first_token(request, engine, state)
            except Exception:
                log.exception("policy %s: %s failed at a first token", self.name, plugin.name)

    def on_completed(
        self, request: RoutingRequest, outcome: RequestOutcome, state: CycleState
    ) -> None:
        """Every plugin hears the end, even when one before it fails (logged): the request is
        over either way, and what a plugin counted for it must be let go."""
        self._catch_up_with(state)
        for plugin in self.plugins:
            try:
                plugin.on_completed(request, outcome, state)
            except Exception:
                log.exception("policy %s: %s failed at a request's end", self.name, plugin.name)
