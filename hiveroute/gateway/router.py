"""The Router: owns the pool, the policy, the metrics and the HTTP client, and their lifecycle.

Later parts (the KV index, the workflow registry, keep-warm) plug in as components with a
start and a stop, and as request hooks that see each request before routing and after it ends.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import aiohttp

from hiveroute.config import RouterConfig
from hiveroute.engines.discovery import build_discovery
from hiveroute.engines.pool import EnginePool
from hiveroute.gateway.admission import AdmissionController
from hiveroute.gateway.auth import Authenticator
from hiveroute.kvindex.service import KvEventService
from hiveroute.observability.metrics import RouterMetrics
from hiveroute.observability.tracing import Tracing, build_tracing
from hiveroute.routing.base import RequestOutcome, RoutingRequest
from hiveroute.routing.policy import Policy
from hiveroute.routing.registry import PluginContext, build_policy

log = logging.getLogger("hiveroute.router")


class Component(Protocol):
    """Something with a lifetime tied to the router's (an event subscriber, a keep-warm loop)."""

    async def start(self, router: Router) -> None: ...

    async def stop(self) -> None: ...


class RequestHook(Protocol):
    """Sees every request before routing and after it ends.

    `before_route` may replace `request.body` (a new dict, never mutated in place) to rewrite
    what the engine receives, or raise a HiverouteError to refuse the request.
    """

    async def before_route(self, request: RoutingRequest) -> None: ...

    def after_complete(self, request: RoutingRequest, outcome: RequestOutcome) -> None: ...


class Router:
    def __init__(
        self,
        config: RouterConfig,
        *,
        pool: EnginePool | None = None,
        services: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.pool = pool or EnginePool(
            config.engine_specs, health_interval_s=config.health_interval_s
        )
        self.metrics = RouterMetrics(config.metrics_roles)
        self.admission = AdmissionController(
            config.max_in_flight, config.admission_queue_depth, config.admission_timeout_s
        )
        self.auth = Authenticator(config.client_api_keys(), config.admin_key, config.salt_secret)
        self.services: dict[str, Any] = services if services is not None else {}
        self.components: list[Component] = []
        discovery = build_discovery(config)
        if discovery is not None:
            self.components.append(discovery)
        # None when tracing is off: the request path then skips every tracing call.
        self.tracing: Tracing | None = build_tracing(
            config.otlp_endpoint,
            config.otlp_service_name,
            config.otlp_sample_ratio,
            {str(k): str(v) for k, v in config.otlp_headers.items()},
        )
        if self.tracing is not None:
            self.components.append(self.tracing)
        self.request_hooks: list[RequestHook] = []
        self.components.append(
            KvEventService.install(
                self.services,
                self.pool,
                self.metrics.registry,
                tokenizer_dir=config.tokenizer,
                max_blocks=config.kv_index_max_blocks,
                speculative_ttl_s=config.kv_speculative_ttl_s,
                topic=config.kv_events_topic,
            )
        )
        from hiveroute.workflows.service import WorkflowService

        WorkflowService.install(self)  # before the policy: the `workflow` policy reads it
        self.policy: Policy = build_policy(
            config.policy, PluginContext(self.pool, self.services), config.policies
        )
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Router.start() has not run")
        return self._session

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        await self.pool.start(self._session)
        for index, component in enumerate(self.components):
            try:
                await component.start(self)
            except BaseException:  # undo what started, so a failed start leaks nothing
                await self._shutdown(self.components[:index])
                raise
        log.info(
            "router started with policy %s and %d engine(s)",
            self.policy.name,
            len(self.pool.engines),
        )

    async def stop(self) -> None:
        await self._shutdown(self.components)

    async def _shutdown(self, components: list[Component]) -> None:
        for component in reversed(components):
            try:
                await component.stop()
            except Exception:
                log.exception("component failed to stop cleanly")
        await self.pool.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None
