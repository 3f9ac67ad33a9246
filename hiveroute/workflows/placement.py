"""Workflow placement: the `workflow` policy's scorer.

The decision is the `kv` policy's (routing/cost.py: a request goes where it costs the fleet
least: its predicted TTFT, the delay its prefill adds to others, the live blocks it evicts).
What a workflow adds is knowledge the KV events cannot have yet:
- a home: the engine its first request is placed on, agreed by every replica before routing
  (set-if-absent in the state store), so keep-warm, pre-warm and the dashboards know where the
  workflow lives; engines it later spills to become secondary homes;
- its engines that send no KV events are expected to hold its shared prefix (the blocks all its
  prompts began with, as learnt, which include its registered context, `context_refs`,
  pre-warmed or in flight for a sibling): they all served it, though this replica may not have
  seen it go there. Where an engine sends KV events, its index says what it holds (evictions
  included), as for any request. Nothing beyond that prefix is lent between its engines: what
  one agent built past it (its own history) is where the KV index says, which may be where
  another replica sent it (lending it to every engine of the workflow made them all look
  equal, and agents left their history whenever their previous request had gone through the
  other replica);
- among engines of equal cost (nothing known), its homes come first, so every replica sends the
  workflow where the others did.
An agent returns to the engine holding its own history because the KV index says so, not by a
rule. Subagents, with or without a workflow: a request that names a parent seen by this router
(`parent_agent_id`, `parent_session_id`, `parent_request_id`; workflows/parents.py) expects the
parent's engine to hold what its prompt shares with the parent's last prompt (a fan-out that
starts from the parent's context reuses it there) where the engine sends no KV events (where it
does, the index says what is still there: a conversation's history may have been evicted
between its turns), and that engine comes first among equal costs; it still goes elsewhere
when the predicted cost says so. The hand-off from the parent's end to the subagent's start is
measured (hiveroute_handoff_latency_seconds). Requests without a workflow or a parent are
priced like any other.

Reasons (`REASON_KEY`): workflow_new_home, workflow_home, workflow_spill (to an
existing secondary home), workflow_new_spill (a new secondary home), workflow_none (no
workflow id), workflow_home_moved (the home left the pool), subagent_parent (a request
without a workflow placed on its parent's engine).
"""

from __future__ import annotations

import time

from hiveroute.engines.engine import Engine
from hiveroute.kvindex.blocks import BlockKey
from hiveroute.kvindex.index import PrefixMatch
from hiveroute.routing.base import (
    CycleState,
    RequestOutcome,
    RoutingRequest,
    Scorer,
    ScorerCategory,
    StateKey,
)
from hiveroute.routing.cache_aware import PrefixMatcher, decision_memory
from hiveroute.routing.cost import PRICES_KEY, CachedPrompt, scores_from_costs
from hiveroute.routing.policy import REASON_KEY
from hiveroute.routing.registry import PluginContext
from hiveroute.routing.request_tokens import request_block_keys
from hiveroute.workflows.parents import (
    PARENT_BLOCK,
    Parents,
    Seen,
    chain_from_keys,
    common_blocks,
    shared_tokens,
)
from hiveroute.workflows.registry import WorkflowView
from hiveroute.workflows.scope import scoped
from hiveroute.workflows.service import WorkflowService

VIEW_KEY: StateKey[WorkflowView] = StateKey("workflow_view")
# where this router's own decisions sent each prefix, for engines without KV events
MEMORY_KEY: StateKey[dict[str, PrefixMatch]] = StateKey("workflow_decision_memory")
# engine name -> what the last decision expected it to hold of the prompt
HELD_KEY: StateKey[dict[str, CachedPrompt]] = StateKey("workflow_expected_held")
# engine name -> predicted TTFT, as this scorer saw them (for logs and tests)
# the request's parent (a subagent's), as this router last saw it placed
PARENT_KEY: StateKey[Seen | None] = StateKey("workflow_parent")


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


def new_context_home(service: WorkflowService, candidates: list[Engine], n_chars: int) -> Engine:
    """Where a context nobody holds yet goes (a declared workflow's home, before its
    pre-warm): the engine where prefilling it costs the fleet least."""
    cost = service.cost
    n_tokens = int(n_chars / 4.0)
    return cost.cheapest([cost.price(e, n_tokens, CachedPrompt()) for e in candidates]).engine


class WorkflowPlacementScorer(Scorer):
    name = "workflow_placement"
    category = ScorerCategory.BALANCE

    def __init__(
        self,
        ctx: PluginContext,
        workflows: WorkflowService,
        *,
        drain_backlog: bool = True,
    ) -> None:
        self.service = workflows
        self.pool = ctx.pool
        self.chars_per_token = 4.0  # learned from usage as requests complete
        # the router's TTFT predictor and backlog, as the `kv` policy sees them
        self.ledger = ctx.costs.ledger(drain_backlog=drain_backlog)
        # what the engines' KV events say each engine holds of a prompt (the `kv` policy's
        # index, tokenizer and per-cycle memo)
        self.matcher = PrefixMatcher(ctx.kv_index, ctx.tokenizer)
        # for engines that send no KV events: where this router's decisions sent each
        # prefix (the `prefix` policy's knowledge), so a workflow still finds its homes
        self.memory = decision_memory(ctx.tokenizer, matches_key=MEMORY_KEY)
        # the router's one cost model (the `kv` policy's ledger, live set and index)
        self.cost = ctx.costs.routing_cost(ctx.kv_index, self.ledger)
        # where each agent, session and request was last placed: a subagent's parent
        self.parents = Parents()

    # --- before the decision: agree on the home --------------------------------------------

    async def prepare(self, request: RoutingRequest, state: CycleState) -> None:
        head = self.matcher.head(request)
        state[PARENT_KEY] = self.parents.parent_of(request.metadata, request.tenant)
        name = request.metadata.workflow_id
        service = self.service
        if name is None:
            return
        view = await service.registry.view(scoped(request.tenant, name))
        if view is None:
            return
        state[VIEW_KEY] = view
        if head is not None and head.ids and view.shared_chain is not None:
            # the prompt's chain as far as the workflow's shared prefix, and a block past it
            covered = (len(view.shared_chain) + 1) * PARENT_BLOCK
            head = self.matcher.head(request, tokens=covered)
            if head is not None:
                self.shorten_shared_prefix(view, self._chain(request, head.ids))
        pool = self.pool
        candidates = pool.candidates(request.model)
        if not candidates:
            return
        if view.home is not None and pool.get(view.home) is not None:
            return
        n = self.tokens(request, state)
        held = {e.name: self.known(request, state, e) for e in candidates}
        priced = self.priced(request, state, held, candidates)
        costs = [self.cost.price(e, n, priced[e.name]) for e in candidates]
        best = self.cost.cheapest(costs).engine
        if view.home is None:
            await service.registry.claim_home(view, best.name)
            if view.home == best.name:
                state[REASON_KEY] = "workflow_new_home"
        else:  # the home left the pool: move it
            await service.registry.replace_home(view, view.home, best.name)
            state[REASON_KEY] = "workflow_home_moved"

    @staticmethod
    def shorten_shared_prefix(view: WorkflowView, chain: list[BlockKey]) -> None:
        """Before pricing a prompt: shorten the workflow's shared prefix to what this prompt
        shares with it, so its engines are credited only with what the prompt begins with."""
        if view.shared_chain is None:
            return
        n = common_blocks(view.shared_chain, chain)
        if n < len(view.shared_chain):
            view.shared_chain = view.shared_chain[:n]

    @staticmethod
    def learn_shared_prefix(view: WorkflowView, chain: list[BlockKey]) -> None:
        """Once a prompt is routed: the workflow's first routed prompt is all of its shared
        prefix (later ones shorten it). A prompt not sent yet is served by no engine: crediting
        the first one to the home it was about to go to priced every new workflow's first
        prefill as a cache hit there, and kept its tokens out of the home's prefill backlog."""
        if view.shared_chain is None:
            view.shared_chain = chain

    def shared_prefix_tokens(self, view: WorkflowView, *, tokenized: bool = True) -> int:
        """Tokens every routed prompt of the workflow began with, learnt from their block keys
        (none before its first prompt is routed); where prompts are not tokenized, estimated
        from the text they began with."""
        if view.shared_chain is not None:
            return len(view.shared_chain) * PARENT_BLOCK
        if tokenized or not view.warm_text:
            return 0
        return int(len(view.warm_text) / self.chars_per_token)

    # --- the decision ---------------------------------------------------------------------

    def tokens(self, request: RoutingRequest, state: CycleState) -> int:
        """The prompt's tokens: counted once it is tokenized whole, estimated from its head
        before, from its characters where it cannot be tokenized here."""
        n = self.matcher.prompt_length(request)
        if n is not None:
            return n
        return int(prompt_chars(request) / self.chars_per_token)

    @staticmethod
    def _chain(request: RoutingRequest, tokens: list[int]) -> list[BlockKey]:
        """The chain of `tokens` (the prompt's, or its head's) for the subagent map, from the
        request's memoised block keys."""
        return chain_from_keys(request_block_keys(request, tokens, PARENT_BLOCK))

    def has_events(self, name: str) -> bool:
        """Whether the KV index knows `name`'s blocks (its events told their size)."""
        engine = self.pool.get(name)
        return engine is not None and self.matcher.block_size(engine) is not None

    def priced(
        self,
        request: RoutingRequest,
        state: CycleState,
        held: dict[str, CachedPrompt],
        candidates: list[Engine],
    ) -> dict[str, CachedPrompt]:
        """What each candidate is priced as holding: `held`, with a widely shared prefix
        priced at this request's share of copying it (`RoutingCost.with_copies`)."""
        holder = max(candidates, key=lambda e: held[e.name].tokens)
        matcher = self.matcher if self.has_events(holder.name) else self.memory
        return matcher.priced(self.cost, request, state, held, holder)

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
        workflow's engines that send no KV events at least its shared prefix
        (`shared_prefix_tokens`), which they all served though this replica may not have seen
        it go there. A subagent's parent's engine is expected to hold what its prompt shares
        with the parent's last one, likewise only without KV events. Where an engine sends
        them, its index (with this router's speculation) says what it still holds: a context
        it evicted since is not there, and lending it made a secondary home that had dropped
        the workflow's context look warm (benchmarks/results/matrix_notes.md, 2026-12-05)."""
        held = {e.name: self.known(request, state, e) for e in candidates}
        parent: Seen | None = state.get(PARENT_KEY)
        if parent is not None and parent.engine in held and not self.has_events(parent.engine):
            # the prompt's chain as far as the parent's, and a block past it
            head = self.matcher.head(request, tokens=(len(parent.chain) + 1) * PARENT_BLOCK)
            if head is not None and head.ids:
                shared = shared_tokens(parent.chain, self._chain(request, head.ids))
                found = held[parent.engine]
                held[parent.engine] = CachedPrompt(
                    max(found.gpu_tokens, shared), found.lower_tokens
                )
        if view is None:
            return held
        head = self.matcher.head(request)
        warm = self.shared_prefix_tokens(view, tokenized=head is not None and bool(head.ids))
        for name in view.engines:
            known = held.get(name)
            if known is not None and not self.has_events(name):
                held[name] = CachedPrompt(max(known.gpu_tokens, warm), known.lower_tokens)
        return held

    def score(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> dict[str, float]:
        view: WorkflowView | None = state.get(VIEW_KEY)
        n = self.tokens(request, state)
        held = self.expected(request, state, view, candidates)
        state[HELD_KEY] = held
        priced = self.priced(request, state, held, candidates)
        costs = [self.cost.price(e, n, priced[e.name]) for e in candidates]
        # among equal costs (nothing known of what the engines hold), a subagent's parent's
        # engine, then the workflow's homes: so every replica sends its requests where the
        # others did
        parent: Seen | None = state.get(PARENT_KEY)
        prefer = [parent.engine] if parent is not None else []
        prefer += view.engines if view is not None else []
        chosen = self.cost.cheapest(costs, prefer)
        state[PRICES_KEY] = costs
        name = chosen.engine.name
        if view is None and parent is not None and name == parent.engine:
            reason = "subagent_parent"
        elif view is None:
            reason = "workflow_none"
        elif name == view.home:
            reason = "workflow_home"
        elif name in view.engines:
            reason = "workflow_spill"
        else:
            reason = "workflow_new_spill"
        state.setdefault(REASON_KEY, reason)
        return scores_from_costs(costs, chosen)

    def on_routed(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        view: WorkflowView | None = state.get(VIEW_KEY)
        tokens = self.matcher.tokens(request, state)  # the whole prompt, now it is on its way
        n = self.tokens(request, state)
        held: dict[str, CachedPrompt] = state.get(HELD_KEY) or {}
        found = held.get(engine.name) or self.known(request, state, engine)
        events = self.matcher.block_size(engine) is not None
        self.matcher.speculate(request, engine, state, None)  # siblings see it before events
        if not events:  # no events from this engine (yet): remember the decision instead
            self.memory.speculate(request, engine, state, None)
        self.cost.request_routed(
            request,
            engine,
            state,
            n_tokens=n,
            held=found,
            tokens=tokens,
            block_size=(self.matcher if events else self.memory).block_size(engine),
        )
        service = self.service
        meta = request.metadata
        chain = self._chain(request, tokens) if tokens else []
        if view is not None and chain:
            self.learn_shared_prefix(view, chain)
        self.parents.routed(
            Parents.own_keys(meta, request.request_id, request.tenant), engine.name, chain
        )
        parent: Seen | None = state.get(PARENT_KEY)
        if view is None and parent is not None and parent.ended_at:
            # a workflow's hand-offs are measured by its registry; this request has none
            service.metrics.handoff.observe(max(0.0, time.time() - parent.ended_at))
        if view is not None and engine.name not in view.engines:
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
        if outcome.ok and outcome.engine is not None:
            keys = Parents.own_keys(request.metadata, request.request_id, request.tenant)
            self.parents.ended(keys, outcome.engine.name)
