"""A WorkflowService built alone (no router), for tests of the plugins that use one."""

from __future__ import annotations

from hiveroute.config import RouterConfig
from hiveroute.engines.client import EngineClient
from hiveroute.engines.pool import EnginePool
from hiveroute.kvindex.tokenizer import BuiltinTokenizer
from hiveroute.observability.metrics import RouterMetrics
from hiveroute.state.memory import MemoryStateStore
from hiveroute.workflows.service import WorkflowService


def workflow_service(pool: EnginePool, config: RouterConfig | None = None) -> WorkflowService:
    return WorkflowService(
        MemoryStateStore(),
        BuiltinTokenizer(),
        config=config or RouterConfig(),
        metrics=RouterMetrics(),
        pool=pool,
        client=EngineClient(),
    )
