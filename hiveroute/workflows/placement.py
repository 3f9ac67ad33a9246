"""Workflow placement: the `workflow` policy's scorer.

The decision is the `kv` policy's (routing/cost.py: a request goes where it costs the fleet
least: its predicted TTFT, the delay its prefill adds to others, the live blocks it evicts).
What a workflow adds is knowledge the KV events cannot have yet:
- a home: the engine its first request is placed on, agreed by every replica before routing
  (set-if-absent in the state store), so keep-warm, pre-warm and the dashboards know where the
  workflow lives; engines it later spills to become secondary homes;
- its registered shared context (`context_refs`) counts as cached on its homes from the moment
  it is placed there (pre-warmed, or in flight for a sibling), before any event confirms it;
- what one of its engines is known to hold of a request, its other engines are expected to hold
  too (they all served its shared prefix, though this replica may not have seen it go there),
  except an agent's own history on its own engine;
- among engines of equal cost (nothing known), its homes come first, so every replica sends the
  workflow where the others did.
An agent returns to the engine holding its own history because the KV index says so, not by a
rule. Requests without a workflow are priced like any other.

Reasons (CycleState["reason"]): workflow_new_home, workflow_home, workflow_spill (to an
existing secondary home), workflow_new_spill (a new secondary home), workflow_none (no
workflow id), workflow_home_moved (the home left the pool).
"""

from __future__ import annotations

from typing import Any

from hiveroute.engines.engine import Engine
from hiveroute.kvindex.request_tokens import TOKEN_IDS_KEY, request_block_keys
from hiveroute.routing.base import (
    CycleState,
    RequestOutcome,
    RoutingRequest,
    Scorer,
    ScorerCategory,
)
from hiveroute.routing.cache_aware import PrefixMatcher, decision_memory
from hiveroute.routing.cost import CachedPrompt, RoutingCost, scores_from_costs
from hiveroute.routing.live_set import live_set
from hiveroute.routing.policy import REASON_KEY
from hiveroute.routing.ttft_ledger import TtftLedger
from hiveroute.workflows.registry import WorkflowView
from hiveroute.workflows.scope import scoped

VIEW_KEY = "workflow_view"
NEW_SPILL_KEY = "workflow_new_spill"
MEMORY_KEY = "workflow_decision_memory"
HELD_KEY = "workflow_expected_held"  # dict[engine name, CachedPrompt] of the last decision
MAX_AGENT_ENGINES = 1024


def prompt_chars(request: RoutingRequest) -> int:
    body = request.body
    if request.is_chat:
        total = 0
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(p) if isinstance(p, str) else 4 for p in prompt)
    return 0


def new_context_home(service: Any, candidates: list[Engine], n_chars: int) -> Engine:
    """Where a context nobody holds yet goes (a declared workflow's home, before its
    pre-warm): the engine where prefilling it costs the fleet least."""
    from hiveroute.kvindex.service import get_kv_index

    services = service.router.services
    cost = RoutingCost(TtftLedger.shared(services), live_set(services), get_kv_index(services))
    n_tokens = int(n_chars / 4.0)
    return RoutingCost.cheapest(
        [cost.price(e, n_tokens, CachedPrompt()) for e in candidates]
    ).engine


class WorkflowPlacementScorer(Scorer):
    name = "workflow_placement"
    category = ScorerCategory.BALANCE

    def __init__(
        self,
        services: dict[str, Any],
        *,
        drain_backlog: bool = True,
    ) -> None:
        self.services = services
        self.chars_per_token = 4.0  # learned from usage as requests complete
        # the router's TTFT predictor and backlog, as the `kv` policy sees them
        self.ledger = TtftLedger.shared(services, drain_backlog=drain_backlog)
        self._matcher: PrefixMatcher | None = None
        self._memory: PrefixMatcher | None = None
        self._cost: RoutingCost | None = None

    @property
    def service(self) -> Any:
        from hiveroute.workflows.service import get_workflow_service

        return get_workflow_service(self.services)

    @property
    def matcher(self) -> PrefixMatcher:
        """What the engines' KV events say each engine holds of a prompt (the `kv` policy's
        index, tokenizer and per-cycle memo)."""
        if self._matcher is None:
            from hiveroute.kvindex.service import get_kv_index, get_tokenizer

            self._matcher = PrefixMatcher(get_kv_index(self.services), get_tokenizer(self.services))
        return self._matcher

    @property
    def memory(self) -> PrefixMatcher:
        """For engines that send no KV events: where this router's decisions sent each
        prefix (the `prefix` policy's knowledge), so a workflow still finds its homes."""
        if self._memory is None:
            self._memory = decision_memory(self.matcher.tokenizer, matches_key=MEMORY_KEY)
        return self._memory

    @property
    def cost(self) -> RoutingCost:
        """The router's one cost model (the `kv` policy's ledger, live set and index)."""
        if self._cost is None:
            self._cost = RoutingCost(self.ledger, live_set(self.services), self.matcher.index)
        return self._cost

    # --- before the decision: agree on the home --------------------------------------------

    async def prepare(self, request: RoutingRequest, state: CycleState) -> None:
        tokens = self.matcher.tokens(request, state)
        name = request.metadata.workflow_id
        service = self.service
        if name is None or service is None:
            return
        view = await service.registry.view(scoped(request.tenant, name))
        if view is None:
            return
        state[VIEW_KEY] = view
        pool = service.router.pool if service.router is not None else None
        if pool is None:
            return
        candidates = pool.candidates(request.model)
        if not candidates:
            return
        if view.home is not None and pool.get(view.home) is not None:
            return
        n = len(tokens) if tokens else self.tokens(request, state)
        costs = [self.cost.price(e, n, self.known(request, state, e)) for e in candidates]
        best = RoutingCost.cheapest(costs).engine
        if view.home is None:
            await service.registry.claim_home(view, best.name)
            if view.home == best.name:
                state[REASON_KEY] = "workflow_new_home"
        else:  # the home left the pool: move it
            await service.registry.replace_home(view, view.home, best.name)
            state[REASON_KEY] = "workflow_home_moved"

    # --- the decision ---------------------------------------------------------------------

    def tokens(self, request: RoutingRequest, state: CycleState) -> int:
        ids = state.get(TOKEN_IDS_KEY)
        if isinstance(ids, list):
            return len(ids)
        return int(prompt_chars(request) / self.chars_per_token)

    def known(self, request: RoutingRequest, state: CycleState, engine: Engine) -> CachedPrompt:
        """What this router knows the engine holds of the prompt: its KV events, or, for an
        engine without events, where this router's own decisions sent the prompt's prefix."""
        events = self.matcher.block_size(engine) is not None
        m = (self.matcher if events else self.memory).match(request, engine, state)
        return CachedPrompt(m.gpu_tokens, m.lower_tokens)

    def expected(
        self,
        request: RoutingRequest,
        state: CycleState,
        view: WorkflowView | None,
        candidates: list[Engine],
    ) -> dict[str, CachedPrompt]:
        """What each engine is expected to hold of this prompt: what is known, and on the
        workflow's engines at least (1) its registered shared context (pre-warmed, or in flight
        for a sibling) and (2) what another of its engines is known to hold, since they all
        served the workflow's shared prefix (this replica may not have seen it go there). The
        agent's own engine does not lend what it holds: that is the agent's own history."""
        held = {e.name: self.known(request, state, e) for e in candidates}
        if view is None:
            return held
        mine = view.agent_engines.get(request.metadata.agent_id or "")
        ours = [name for name in view.engines if name in held]
        lent = max((held[name].gpu_tokens for name in ours if name != mine), default=0)
        warm = int(len(view.warm_text) / self.chars_per_token) if view.warm_text else 0
        for name in ours:
            found = held[name]
            held[name] = CachedPrompt(max(found.gpu_tokens, lent, warm), found.lower_tokens)
        return held

    def score(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> dict[str, float]:
        view: WorkflowView | None = state.get(VIEW_KEY)
        n = self.tokens(request, state)
        held = self.expected(request, state, view, candidates)
        state[HELD_KEY] = held
        costs = [self.cost.price(e, n, held[e.name]) for e in candidates]
        # among equal costs (nothing known of what the engines hold), the workflow's homes:
        # so every replica sends its requests where the others did
        chosen = RoutingCost.cheapest(costs, view.engines if view is not None else ())
        name = chosen.engine.name
        if view is None:
            reason = "workflow_none"
        elif name == view.home:
            reason = "workflow_home"
        elif name in view.engines:
            reason = "workflow_spill"
        else:
            reason = "workflow_new_spill"
        state.setdefault(REASON_KEY, reason)
        state["predicted_ttft"] = {c.engine.name: c.ttft_s for c in costs}
        return scores_from_costs(costs, chosen)

    def on_routed(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        view: WorkflowView | None = state.get(VIEW_KEY)
        n = self.tokens(request, state)
        held: dict[str, CachedPrompt] = state.get(HELD_KEY) or {}
        found = held.get(engine.name) or self.known(request, state, engine)
        self.ledger.routed(engine, n - found.tokens, state)
        events = self.matcher.block_size(engine) is not None
        self.matcher.speculate(request, engine, state, None)  # siblings see it before events
        if not events:  # no events from this engine (yet): remember the decision instead
            self.memory.speculate(request, engine, state, None)
        tokens = state.get(TOKEN_IDS_KEY)
        size = (self.matcher if events else self.memory).block_size(engine)
        if isinstance(tokens, list) and tokens and size is not None:
            self.cost.routed(engine, request_block_keys(request, state, tokens, size))
        service = self.service
        agent = request.metadata.agent_id
        if view is not None and agent is not None:
            view.agent_engines[agent] = engine.name
            while len(view.agent_engines) > MAX_AGENT_ENGINES:
                view.agent_engines.pop(next(iter(view.agent_engines)))
        if view is not None and service is not None and engine.name not in view.engines:
            view.secondaries.append(engine.name)  # visible to the next sibling at once
            service.spawn(service.registry.add_secondary(view, engine.name))

    def on_first_token(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        self.ledger.first_token(state)

    def on_completed(
        self, request: RoutingRequest, outcome: RequestOutcome, state: CycleState
    ) -> None:
        if outcome.ok and outcome.prompt_tokens:
            chars = prompt_chars(request)
            if chars > 0:
                self.chars_per_token = 0.9 * self.chars_per_token + 0.1 * (
                    chars / outcome.prompt_tokens
                )
        self.ledger.completed(request, outcome, state)
