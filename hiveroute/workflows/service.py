"""Workflows in a router: the registry, contexts, request hook, metrics, keep-warm.

The assembly builds one WorkflowService and hands it to the parts that use it: the request
pipeline (as a request hook), the `workflow` policy's scorer and the control API. As a router
component it runs the expiry sweeper and the keep-warm loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from hiveroute.config import RouterConfig
from hiveroute.engines.client import EngineClient
from hiveroute.engines.pool import EnginePool
from hiveroute.kvindex.index import KvIndex
from hiveroute.kvindex.tokenizer import Tokenizer
from hiveroute.observability.metrics import RouterMetrics, Series
from hiveroute.routing.base import RequestOutcome, RoutingRequest
from hiveroute.routing.cost import RoutingCost
from hiveroute.routing.costs import CostModel
from hiveroute.state.store import StateStore
from hiveroute.workflows.accounting import CrossAgentAccountant
from hiveroute.workflows.contexts import ContextRegistry
from hiveroute.workflows.expansion import expand_contexts, names_contexts
from hiveroute.workflows.keepwarm import KeepWarm
from hiveroute.workflows.model import RequestRecord
from hiveroute.workflows.prefix_text import MIN_WARM_CHARS, common_prefix, leading_text
from hiveroute.workflows.priorities import plas_priority
from hiveroute.workflows.registry import RegistryLimits, WorkflowRegistry, WorkflowView
from hiveroute.workflows.scope import scoped

log = logging.getLogger("hiveroute.workflows")

MAX_PENDING = 100_000
SWEEP_EVERY_S = 1.0
# how often the active workflows are counted in the store: Prometheus' default scrape interval
COUNT_EVERY_S = 15.0


@dataclass
class _Pending:
    view: WorkflowView
    record: RequestRecord
    started_mono: float
    recorded: asyncio.Task[None]  # its start's bookkeeping (`record_start`)


class WorkflowMetrics:
    """The workflow series: the router's own (RouterMetrics) plus the registry's gauges."""

    def __init__(self, router_metrics: RouterMetrics) -> None:
        registry = router_metrics.registry
        self.cross_agent = router_metrics.cross_agent_cached_tokens
        self.handoff = router_metrics.handoff_latency
        self.workflow_ttft = router_metrics.workflow_ttft
        self.completion = router_metrics.workflow_completion
        self.workflow_prompt_tokens = Series(
            Counter(
                "hiveroute_workflow_prompt_tokens",
                "Prompt tokens of requests that belong to a workflow",
                ["engine"],
                registry=registry,
            )
        )
        self.active = Gauge(
            "hiveroute_workflows_active",
            "Active workflows in the router's state store (replicas sharing one report alike)",
            registry=registry,
        )
        self.keep_warm = Counter(
            "hiveroute_keep_warm_requests",
            "Keep-warm and pre-warm requests, by engine, kind (touch, retain, prewarm) and result",
            ["engine", "kind", "result"],
            registry=registry,
        )


class WorkflowService:
    def __init__(
        self,
        store: StateStore,
        tokenizer: Tokenizer,
        *,
        config: RouterConfig,
        metrics: RouterMetrics,
        pool: EnginePool,
        client: EngineClient,
        cost: RoutingCost | None = None,
        cache_salt: Callable[[str], str] | None = None,
    ) -> None:
        """`cache_salt`: a tenant's salt, as its requests carry it (the router's
        Authenticator), for the requests the workflow sends itself (keep-warm, pre-warm);
        None for a router without tenants."""
        self.config = config
        self.store = store
        self.tokenizer = tokenizer
        self.registry = WorkflowRegistry(
            store,
            RegistryLimits(
                ttl_s=config.workflow_ttl_s,
                retain_s=config.workflow_retain_s,
                max_requests=config.workflow_max_requests,
                max_agents=config.workflow_max_agents,
                max_workflows=config.max_workflows,
            ),
            spawn=self.spawn,  # views past their time are refreshed out of requests' paths
        )
        self.contexts = ContextRegistry(
            store,
            lambda text: len(tokenizer.encode(text, add_special_tokens=False)),
            max_bytes=config.context_max_bytes,
            max_contexts=config.context_max_count,
        )
        self.accountant = CrossAgentAccountant(tokenizer, max_workflows=config.max_workflows)
        self.metrics = WorkflowMetrics(metrics)
        self.pool = pool
        # what a prefill costs on each engine (the routing cost model): where a new context goes
        self.cost = cost if cost is not None else CostModel().routing_cost(KvIndex())
        self.keep_warm = KeepWarm(self, pool, client, cache_salt)
        # by the request's identity (`id` of its RoutingRequest, alive until after_complete),
        # not its id: clients reuse X-Request-Id (a proxy's retry or hedge keeps it)
        self._pending: OrderedDict[int, _Pending] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.registry.on_state_change(self._on_state_change)
        self.registry.handoff_observer = self.metrics.handoff.observe
        self.registry.workflow_ttft_observer = self.metrics.workflow_ttft.observe
        self.registry.completion_observer = self.metrics.completion.observe

    # --- component ------------------------------------------------------------------------

    async def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="workflow-sweeper")
        await self.keep_warm.start()

    async def stop(self) -> None:
        await self.keep_warm.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None
        await self.flush()

    async def _sweep_loop(self) -> None:
        counted_at = -math.inf
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            try:
                await self.registry.sweep()
                if time.monotonic() - counted_at >= COUNT_EVERY_S:
                    counted_at = time.monotonic()
                    self.metrics.active.set(await self.registry.count_active())
            except Exception:
                log.exception("workflow sweep failed")

    def _on_state_change(self, workflow_id: str, state: str) -> None:
        self.accountant.forget(workflow_id)
        self.keep_warm.forget(workflow_id)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("workflow bookkeeping failed", exc_info=task.exception())

    async def flush(self) -> None:
        """Wait for bookkeeping of finished requests (the API reads after it)."""
        for _ in range(10):
            if not self._tasks:
                return
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- request hook ---------------------------------------------------------------------

    def scheduling_on(self, view: WorkflowView) -> bool:
        return bool(view.settings.priority_scheduling or self.config.workflow_priorities)

    def layout_on(self, view: WorkflowView | None) -> bool:
        """The layout for a workflow (None: one not created yet, so its default settings)."""
        own = view is not None and view.settings.shared_prefix_layout
        return bool(own or self.config.shared_prefix_layout)

    async def before_route(self, request: RoutingRequest) -> None:
        meta = request.metadata
        workflow_key = scoped(request.tenant, meta.workflow_id) if meta.workflow_id else None
        known = await self._known(request, workflow_key) if workflow_key else None
        expansion = await expand_contexts(
            request.body,
            path=request.path,
            refs=meta.context_refs,
            tenant=request.tenant,
            workflow_id=workflow_key,
            workflow_context_ids=known.settings.context_ids if known else [],
            layout=bool(workflow_key) and self.layout_on(known),
            contexts=self.contexts,
            max_bytes=self.config.max_body_bytes,
        )
        view = await self.registry.create_or_revive(workflow_key, known) if workflow_key else None
        if expansion is not None:
            request.body = expansion.body
        if meta.priority is not None and "priority" not in request.body:
            request.body = {**request.body, "priority": meta.priority}
        if view is None:
            return
        if self.scheduling_on(view) and "priority" not in request.body:
            level = plas_priority(
                view.service_tokens, quantum_tokens=self.config.priority_quantum_tokens
            )
            request.body = {**request.body, "priority": level}
        self._learn_prefix(view, request, expansion.shared_prefix if expansion else None)
        # routing reads none of the start's bookkeeping: it is written while the request runs
        record = self.registry.new_record(
            view,
            request_id=request.request_id,
            agent_id=meta.agent_id,
            agent_role=meta.agent_role,
            stage=meta.stage,
            parent_request_id=meta.parent_request_id,
            parent_agent_id=meta.parent_agent_id or meta.parent_session_id,
        )
        started = self.spawn(self.registry.record_start(view, record))
        now = time.monotonic()
        self._pending[id(request)] = _Pending(view, record, now, started)
        view.in_flight[id(request)] = now
        # after_complete ends every request (refused ones too); this only bounds the map.
        stale = self.config.request_timeout_s + 60.0
        while self._pending and (
            len(self._pending) > MAX_PENDING
            or now - next(iter(self._pending.values())).started_mono > stale
        ):
            dropped_id, dropped = self._pending.popitem(last=False)
            dropped.view.in_flight.pop(dropped_id, None)

    async def _known(self, request: RoutingRequest, workflow_key: str) -> WorkflowView | None:
        """The request's workflow before its contexts are expanded. One this replica holds no
        view of is created in the same round trip as the read, unless the request names
        contexts: refused below (an unknown or foreign one), it must leave no workflow behind,
        so it reads first. A workflow seen for the first time has the default settings."""
        meta = request.metadata
        if self.registry.holds(workflow_key) or names_contexts(
            request.body, path=request.path, refs=meta.context_refs
        ):
            return await self.registry.view(workflow_key)
        return await self.registry.load_or_create(workflow_key)

    def _learn_prefix(
        self, view: WorkflowView, request: RoutingRequest, shared_prefix: str | None
    ) -> None:
        view.path = request.path
        view.model = request.model or view.model
        if shared_prefix is not None:
            view.shared_prefix = shared_prefix
            view.warm_text = shared_prefix
            return
        if view.shared_prefix is not None:
            return
        text = leading_text(request.path, request.body)
        if text is None:
            return
        if view.warm_text is None:
            view.warm_text = text
        elif not text.startswith(view.warm_text):  # once learnt, a prefix is checked, not redone
            view.warm_text = common_prefix(view.warm_text, text)

    def after_complete(self, request: RoutingRequest, outcome: RequestOutcome) -> None:
        pending = self._pending.pop(id(request), None)
        if pending is None:
            return
        view = pending.view
        view.in_flight.pop(id(request), None)
        if outcome.engine is not None:
            view.last_used[outcome.engine.name] = time.monotonic()
        self.spawn(self._finish(request, outcome, pending))

    async def _finish(
        self, request: RoutingRequest, outcome: RequestOutcome, pending: _Pending
    ) -> None:
        view, record = pending.view, pending.record
        try:
            await pending.recorded  # a start written after its end would undo the end
        except Exception:
            return  # the start's failure is logged (spawn); an end without a start is not kept
        engine = outcome.engine.name if outcome.engine is not None else None
        cross: int | None = None
        if outcome.ok and outcome.prompt_tokens is not None and engine is not None:
            keys = self.accountant.block_keys(request)
            if keys is not None:
                cross = self.accountant.account(
                    view.id,
                    record.agent_id,
                    engine,
                    keys,
                    outcome.cached_tokens,
                    record.started_at,
                )
                if cross:
                    self.metrics.cross_agent.labels(engine).inc(cross)
            self.metrics.workflow_prompt_tokens.labels(engine).inc(outcome.prompt_tokens)
        if outcome.ok:
            status = "ok"
        elif outcome.status == 499:
            status = "cancelled"
        else:
            status = f"error_{outcome.status}"
        await self.registry.finish_request(
            view.id,
            record,
            engine=engine,
            status=status,
            ttft_s=outcome.ttft_s,
            duration_s=outcome.duration_s,
            prompt_tokens=outcome.prompt_tokens,
            cached_tokens=outcome.cached_tokens,
            cross_agent_cached_tokens=cross,
            completion_tokens=outcome.completion_tokens,
        )


def warm_worthy(text: str | None) -> bool:
    return text is not None and len(text) >= MIN_WARM_CHARS
