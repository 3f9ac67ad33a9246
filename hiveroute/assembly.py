"""The assembly: builds every part of a router, in order, and hands each its dependencies.

Nothing is looked up by name at run time: each part gets what it uses through its constructor,
and the result is one typed object, the Router. The order is the dependency order:

    EngineClient -> pool -> metrics -> auth -> admission -> discovery -> tracing
    -> tokenizer -> KV index + event service -> TTFT cost model -> state store
    -> workflow service -> plugin registry + policy -> request pipeline

Components (parts with a lifetime) start in that order and stop in reverse; `start()` takes no
argument, as a starlette lifespan does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import cast

from aiohttp import web

from hiveroute.config import RouterConfig
from hiveroute.engines.client import EngineClient, EngineTimeouts
from hiveroute.engines.discovery import build_discovery
from hiveroute.engines.load_board import LoadBoard
from hiveroute.engines.pool import EnginePool
from hiveroute.gateway.admission import AdmissionController
from hiveroute.gateway.app import build_app
from hiveroute.gateway.auth import Authenticator
from hiveroute.gateway.pipeline import RequestPipeline, ServedHook
from hiveroute.gateway.response_ids import ResponseIds
from hiveroute.kvindex.index import KvIndex
from hiveroute.kvindex.service import KvEventService, KvIndexCollector, build_kv_index
from hiveroute.kvindex.shared_chunks import SharedChunksCollector, SharedChunkStore
from hiveroute.kvindex.tokenizer import Tokenizer, load_tokenizer
from hiveroute.lifecycle import Component
from hiveroute.observability.dashboard import add_dashboard_routes
from hiveroute.observability.loop_lag import LoopLagProbe
from hiveroute.observability.metrics import RouterMetrics
from hiveroute.observability.tracing import Tracing, build_tracing
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.costs import CostModel
from hiveroute.routing.live_set import LiveSet
from hiveroute.routing.policy import Policy
from hiveroute.routing.registry import PluginContext, PluginRegistry, build_policy
from hiveroute.state.store import StateStore, open_state_store
from hiveroute.workflows import api as workflow_api
from hiveroute.workflows.cache_hints import CacheControlHints
from hiveroute.workflows.placement import WorkflowPlacementScorer
from hiveroute.workflows.service import WorkflowService

log = logging.getLogger("hiveroute.router")


@dataclass
class Router:
    """Every part of one router, built by `assemble`."""

    config: RouterConfig
    engine_client: EngineClient
    pool: EnginePool
    metrics: RouterMetrics
    auth: Authenticator
    admission: AdmissionController
    tracing: Tracing | None
    tokenizer: Tokenizer
    kv_index: KvIndex
    kv_events: KvEventService
    costs: CostModel
    state_store: StateStore
    workflows: WorkflowService
    plugins: PluginRegistry
    policy: Policy
    pipeline: RequestPipeline
    response_ids: ResponseIds
    components: list[Component] = field(default_factory=list)
    _started: list[Component] = field(default_factory=list, repr=False)

    async def start(self) -> None:
        """Open the engine connections, check the engines once, start every component."""
        await self.engine_client.start()
        try:
            await self.pool.start()
            for component in self.components:
                await component.start()
                self._started.append(component)
        except BaseException:  # undo what started, so a failed start leaks nothing
            await self.stop()
            raise
        log.info(
            "router started with policy %s and %d engine(s)",
            self.policy.name,
            len(self.pool.engines),
        )

    async def stop(self) -> None:
        for component in reversed(self._started):
            try:
                await component.stop()
            except Exception:
                log.exception("component failed to stop cleanly")
        self._started.clear()
        await self.pool.stop()
        await self.engine_client.stop()

    def app(self) -> web.Application:
        """The aiohttp app serving this router (it starts and stops the router with itself)."""
        return build_app(
            self,
            self,
            mounts=[
                lambda app: workflow_api.add_routes(app, self.workflows),
                lambda app: add_dashboard_routes(
                    app, self.pool, self.metrics, self.policy.name, self.kv_events
                ),
            ],
        )


def check_config(config: RouterConfig) -> None:
    """Build a router from `config` and drop it: what only building finds (a custom policy's
    parameters, a missing extra, a tokenizer directory) then stops `serve` before it starts
    any engine or worker, as a usage error, rather than in every worker after the engines."""
    router = assemble(config)
    if router.tracing is not None:  # its exporter's thread started with it; nothing to flush
        router.tracing.provider.shutdown()


def assemble(
    config: RouterConfig,
    *,
    store: StateStore | None = None,
    board: LoadBoard | None = None,
    shared_chunks: SharedChunkStore | None = None,
) -> Router:
    """Build a router from its config (nothing runs until `start()`); `store`, when given, is
    the shared state instead of the one `config.state` names (a worker's view of its parent's
    store under `serve --workers`); `board`, when given, is the host's load board, where this
    worker and its siblings count what each has in flight on each engine; `shared_chunks`,
    where they share the chunks of prompts each has tokenized (workers.py)."""
    client = EngineClient(
        api_key=config.engine_api_key,
        timeouts=EngineTimeouts(
            connect_s=config.connect_timeout_s,
            first_byte_s=config.first_byte_timeout_s,
            request_s=config.request_timeout_s,
        ),
    )
    pool = EnginePool(
        config.engine_specs,
        client=client,
        health_interval_s=config.health_interval_s,
        board=board,
    )
    metrics = RouterMetrics(config.metrics_roles)
    auth = Authenticator(config.client_api_keys(), config.admin_key, config.salt_secret)
    admission = AdmissionController(
        config.max_in_flight, config.admission_queue_depth, config.admission_timeout_s
    )
    components: list[Component] = [LoopLagProbe(metrics.loop_lag)]
    discovery = build_discovery(config, pool)
    if discovery is not None:
        components.append(discovery)
    # None when tracing is off: the request path then skips every tracing call.
    tracing = build_tracing(
        config.otlp_endpoint,
        config.otlp_service_name,
        config.otlp_sample_ratio,
        {str(k): str(v) for k, v in config.otlp_headers.items()},
    )
    if tracing is not None:
        components.append(tracing)
    tokenizer = load_tokenizer(config.tokenizer, shared_chunks=shared_chunks)
    if shared_chunks is not None:
        metrics.registry.register(SharedChunksCollector(shared_chunks))
    kv_index = build_kv_index(config.kv_index_max_blocks, config.kv_speculative_ttl_s)
    kv_events = KvEventService(pool, kv_index, topic=config.kv_events_topic)
    metrics.registry.register(KvIndexCollector(kv_events))
    components.append(kv_events)
    costs = CostModel(backlog=PrefillBacklog(board=board), live=LiveSet(board=board))
    pool.on_removed(lambda engine: costs.forget(engine.name))
    pool.on_removed(lambda engine: metrics.forget_engine(engine.name))
    store = store if store is not None else open_state_store(config.state)
    bind_metrics = getattr(store, "bind_metrics", None)
    if bind_metrics is not None:  # Redis: health, metrics and connections live with the router
        bind_metrics(metrics.state)
        components.append(cast(Component, store))
    else:  # in memory: always up
        metrics.state.backend_up.labels(store.name).set(1)
    metrics.state.known_backend(store.name)
    workflows = WorkflowService(
        store,
        tokenizer,
        config=config,
        metrics=metrics,
        pool=pool,
        client=client,
        cost=costs.routing_cost(kv_index),
        cache_salt=auth.cache_salt,
    )
    components.append(workflows)
    plugins = PluginRegistry()
    plugins.register(
        "workflow_placement", lambda ctx, **kw: WorkflowPlacementScorer(ctx, workflows, **kw)
    )
    context = PluginContext(pool, tokenizer=tokenizer, kv_index=kv_index, costs=costs)
    policy = build_policy(config.policy, context, config.policies, plugins)
    pipeline = RequestPipeline(
        pool=pool,
        client=client,
        policy=policy,
        metrics=metrics,
        admission=admission,
        hooks=[workflows, ServedHook(kv_events.served), CacheControlHints(workflows.keep_warm)],
        retries=config.retries,
        forward_authorization=not auth.enabled,
    )
    return Router(
        config=config,
        engine_client=client,
        pool=pool,
        metrics=metrics,
        auth=auth,
        admission=admission,
        tracing=tracing,
        tokenizer=tokenizer,
        kv_index=kv_index,
        kv_events=kv_events,
        costs=costs,
        state_store=store,
        workflows=workflows,
        plugins=plugins,
        policy=policy,
        pipeline=pipeline,
        response_ids=ResponseIds(store, pool),
        components=components,
    )
