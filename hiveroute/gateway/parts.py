"""What the HTTP layer reads from the router, as a protocol: the assembly's Router has it.

The gateway never imports the assembly (which imports the gateway); its handlers find these
parts on the app under GATEWAY_KEY.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from hiveroute.config import RouterConfig
from hiveroute.engines.pool import EnginePool
from hiveroute.gateway.auth import Authenticator
from hiveroute.gateway.pipeline import RequestPipeline
from hiveroute.gateway.response_ids import ResponseIds
from hiveroute.observability.metrics import RouterMetrics
from hiveroute.observability.tracing import Tracing
from hiveroute.routing.policy import Policy


class GatewayParts(Protocol):
    @property
    def config(self) -> RouterConfig: ...

    @property
    def pool(self) -> EnginePool: ...

    @property
    def metrics(self) -> RouterMetrics: ...

    @property
    def auth(self) -> Authenticator: ...

    @property
    def tracing(self) -> Tracing | None: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def pipeline(self) -> RequestPipeline: ...

    @property
    def response_ids(self) -> ResponseIds: ...


GATEWAY_KEY: web.AppKey[GatewayParts] = web.AppKey("gateway", GatewayParts)
