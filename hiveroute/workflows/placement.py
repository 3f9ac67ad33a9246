"""Workflow placement: the `workflow` policy's scorer.

A new workflow gets a home engine among those home to the fewest active workflows (weighted by
context size), the freest of them now; every replica agrees on it (set-if-absent in the state
store). Its agents follow the home while the predicted TTFT there
is not far worse than the alternatives' (`home_margin`: by default up to 9 × the best, since
leaving costs a prefill and a second copy of the context) and its load stays under a loose
bounded-load limit (8 × the average + 32 by default: measured, staying home beats spilling early
on fan-out workloads; benchmarks/results/workflow_tuning.md); an
agent that already ran on one of the workflow's engines returns there, where its own history is
cached too: the home holds the workflow's prefix, so it is predicted to need only
the uncached rest, while another engine would prefill everything. When a fan-out would overload
the home (its queue past a bounded-load limit, or its predicted TTFT worse than elsewhere even
with the cache), siblings spill to a second engine, which becomes a secondary home: later
spills go there too, so the shared context is prefilled there once, not once per request. Up to
`max_homes` engines per workflow. Requests without a workflow go where predicted TTFT is least.

Reasons (CycleState["reason"]): workflow_new_home, workflow_home, workflow_spill (to an
existing secondary home), workflow_new_spill (a new secondary home), workflow_none (no
workflow id: least predicted TTFT), workflow_home_moved (the home left the pool).
"""

from __future__ import annotations

import math
from typing import Any

from hiveroute.engines.engine import Engine
from hiveroute.routing.base import (
    CycleState,
    RequestOutcome,
    RoutingRequest,
    Scorer,
    ScorerCategory,
    StateKey,
    load_bound,
)
from hiveroute.routing.cache_aware import PrefixMatcher
from hiveroute.routing.footprint import new_context_engine
from hiveroute.routing.policy import REASON_KEY
from hiveroute.routing.registry import PluginContext
from hiveroute.routing.request_tokens import TOKEN_IDS_KEY
from hiveroute.workflows.registry import WorkflowView
from hiveroute.workflows.scope import scoped
from hiveroute.workflows.service import WorkflowService

VIEW_KEY: StateKey[WorkflowView] = StateKey("workflow_view")
# engine name -> predicted TTFT, as this scorer saw them (for logs and tests)
PREDICTED_KEY: StateKey[dict[str, float]] = StateKey("workflow_predicted_ttft")
MAX_AGENT_ENGINES = 1024
HOME_TOLERANCE = 0.5  # workflows of average size an engine may be home to beyond the least
HOME_FADE_S = 60.0  # an idle workflow's weight on its home fades after this, then decays


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


def home_fitness(engine: Engine) -> float:
    """How free `engine` is this instant: free KV capacity over queued requests."""
    free = max(0.0, 1.0 - engine.load.kv_usage)
    return (0.1 + free) / (1.0 + engine.load.queue_depth)


def homed_load(
    views: list[WorkflowView], now: float, fade_s: float = HOME_FADE_S
) -> dict[str, float]:
    """What each engine is home to, in workflows of average context size (secondaries half).

    A workflow's agents come back to its home after every tool call, so the workflows living on
    an engine say more about its load to come than its queue this instant (a fan-out's burst or
    a round of tool calls). A workflow's weight is its shared context's size (the KV it keeps
    resident there) over the average, and fades once it has been idle for `fade_s`: one that
    finished without being ended no longer counts after a few minutes.
    """
    sizes = [len(v.warm_text) for v in views if v.warm_text]
    mean = sum(sizes) / len(sizes) if sizes else 1.0
    loads: dict[str, float] = {}
    for view in views:
        size = len(view.warm_text) / mean if view.warm_text else 1.0
        idle = max(0.0, now - view.last_active_at - fade_s)
        weight = size * math.exp(-idle / fade_s)
        for i, name in enumerate(view.engines):
            loads[name] = loads.get(name, 0.0) + (weight if i == 0 else 0.5 * weight)
    return loads


def best_home(
    candidates: list[Engine],
    views: list[WorkflowView],
    now: float,
    home_tolerance: float = HOME_TOLERANCE,
) -> Engine:
    """A new workflow's home: among the engines home to the fewest workflows (within
    `home_tolerance` of an average workflow), the freest now.

    Balancing homes first is what keeps the fleet's KV and decode load even over a workflow's
    life (SGLang's router gets the same from sending unmatched prompts to its smallest tree);
    an instant's queue only breaks the tie.
    """
    loads = homed_load(views, now)
    least = min(loads.get(e.name, 0.0) for e in candidates)
    near = [e for e in candidates if loads.get(e.name, 0.0) <= least + home_tolerance + 1e-9]
    return max(near, key=lambda e: (home_fitness(e), e.name))


def new_home(
    service: Any, candidates: list[Engine], home_tolerance: float = HOME_TOLERANCE
) -> Engine:
    """`best_home` over the workflows this replica knows to be active (`WorkflowService`)."""
    registry = service.registry
    return best_home(candidates, registry.active_views(), registry.clock(), home_tolerance)


class WorkflowPlacementScorer(Scorer):
    name = "workflow_placement"
    category = ScorerCategory.BALANCE

    def __init__(
        self,
        ctx: PluginContext,
        workflows: WorkflowService,
        *,
        load_factor: float = 8.0,
        slack: int = 32,
        max_homes: int = 2,
        home_margin: float = 8.0,
        chars_per_token: float = 4.0,
        home_tolerance: float = HOME_TOLERANCE,
        drain_backlog: bool = True,
    ) -> None:
        if load_factor < 1.0:
            raise ValueError("load_factor must be at least 1.0")
        if (
            slack < 0
            or max_homes < 1
            or home_margin < 0
            or chars_per_token <= 0
            or home_tolerance < 0
        ):
            raise ValueError(
                "slack, home_margin and home_tolerance must be >= 0, max_homes >= 1, "
                "chars_per_token > 0"
            )
        self.service = workflows
        self.pool = ctx.pool
        self.load_factor = load_factor
        self.slack = slack
        self.max_homes = max_homes
        self.home_margin = home_margin
        self.chars_per_token = chars_per_token  # learned from usage as requests complete
        # how far past the least-homed engine a new home may be (in average workflows)
        self.home_tolerance = home_tolerance
        # the router's TTFT predictor, backlog and footprint, as the `kv` policy sees them
        self.ledger = ctx.costs.ledger(drain_backlog=drain_backlog)
        # what the engines' KV events say each engine holds of a prompt (the `kv` policy's
        # index, tokenizer and per-cycle memo)
        self.matcher = PrefixMatcher(ctx.kv_index, ctx.tokenizer)

    # --- before the decision: agree on the home --------------------------------------------

    async def prepare(self, request: RoutingRequest, state: CycleState) -> None:
        self.matcher.tokens(request, state)
        name = request.metadata.workflow_id
        service = self.service
        if name is None or service is None:
            return
        view = await service.registry.view(scoped(request.tenant, name))
        if view is None:
            return
        state[VIEW_KEY] = view
        pool = self.pool
        candidates = pool.candidates(request.model)
        if not candidates:
            return
        names = {e.name for e in candidates}
        if view.home is None:
            best = new_home(service, candidates, self.home_tolerance)
            await service.registry.claim_home(view, best.name)
            if view.home == best.name:
                state[REASON_KEY] = "workflow_new_home"
        elif pool.get(view.home) is None:  # the home left the pool: move it
            best = new_home(service, candidates, self.home_tolerance)
            await service.registry.replace_home(view, view.home, best.name)
            state[REASON_KEY] = "workflow_home_moved"
        elif view.home not in names and view.secondaries:
            pass  # home is down for now: secondaries or the best alternative take over

    # --- the decision ---------------------------------------------------------------------

    def tokens(self, request: RoutingRequest, state: CycleState) -> int:
        ids = state.get(TOKEN_IDS_KEY)
        if isinstance(ids, list):
            return len(ids)
        return int(prompt_chars(request) / self.chars_per_token)

    def bound(self, candidates: list[Engine]) -> int:
        return load_bound(candidates, self.load_factor, self.slack)

    def _cached(
        self,
        request: RoutingRequest,
        state: CycleState,
        view: WorkflowView | None,
        engine: Engine,
        n_tokens: int,
    ) -> int:
        """Tokens of this prompt the engine is expected to hold: what its KV events say (an
        agent's own history included), and at least the workflow's shared prefix on its homes
        (put there by its earlier requests, a pre-warm, or a sibling in flight)."""
        exact = min(n_tokens, self.matcher.match(request, engine, state).tokens)
        if view is None or engine.name not in view.engines:
            return exact
        warm = int(min(n_tokens, len(view.warm_text or "") / self.chars_per_token))
        return max(exact, warm)

    def score(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> dict[str, float]:
        view: WorkflowView | None = state.get(VIEW_KEY)
        n = self.tokens(request, state)
        predicted: dict[str, float] = {}
        cached: dict[str, int] = {}
        for e in candidates:
            cached[e.name] = self._cached(request, state, view, e, n)
            predicted[e.name] = self.ledger.predict(e, n - cached[e.name])
        by_name = {e.name: e for e in candidates}
        bound = self.bound(candidates)

        def fits(name: str) -> bool:
            return by_name[name].load.queue_depth + 1 <= bound

        best_any = min(predicted.values())
        chosen: str
        reason: str
        if view is None:
            placed = new_context_engine(
                candidates, predicted, predicted, cached, n, self.ledger.footprint
            )
            if placed is None:  # not a new context: the fastest first token
                placed = min(candidates, key=lambda e: (predicted[e.name], e.name))
            chosen = placed.name
            reason = "workflow_none"
        else:
            homes = [e for e in view.engines if e in by_name]
            home = view.home if view.home in by_name else None
            agent = request.metadata.agent_id
            mine = view.agent_engines.get(agent) if agent is not None else None
            # The agent's own engine holds its history too; then the home; then secondaries.
            order = list(dict.fromkeys([*([mine] if mine in homes else []), *homes]))
            limit = best_any * (1.0 + self.home_margin) + 1e-9
            within = [h for h in order if fits(h) and predicted[h] <= limit]
            if within:
                chosen = within[0]
                reason = "workflow_home" if chosen == home else "workflow_spill"
            elif len(homes) >= self.max_homes:  # no more homes: the least bad one of them
                chosen = min(homes, key=lambda h: (predicted[h], h))
                reason = "workflow_home" if chosen == home else "workflow_spill"
            else:
                others = [e for e in candidates if e.name not in homes and fits(e.name)]
                pool = others or candidates
                chosen = min(pool, key=lambda e: (predicted[e.name], e.name)).name
                reason = "workflow_new_spill" if chosen not in homes else "workflow_spill"
            state.setdefault(REASON_KEY, reason)
        state.setdefault(REASON_KEY, reason)
        state[PREDICTED_KEY] = predicted
        return {
            name: 1.0 if name == chosen else 0.5 * (best_any / p if p > 0 else 1.0)
            for name, p in predicted.items()
        }

    def on_routed(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        view: WorkflowView | None = state.get(VIEW_KEY)
        n = self.tokens(request, state)
        self.ledger.routed(engine, n - self._cached(request, state, view, engine, n), state)
        self.matcher.speculate(request, engine, state, None)  # siblings see it before events
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
