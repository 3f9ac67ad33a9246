"""The router's own Prometheus metrics, all under ``hiveroute_``.

Labels are only ever bounded sets (engine, policy, status class, reason, endpoint): never a
workflow id, request id or prompt. Each router builds its own registry, so tests and several
routers in one process do not collide.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hiveroute.config import DEFAULT_ROLES, MAX_ROLES

OTHER_ROLE = "other"
NO_ROLE = "none"

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
# An event loop's lateness: under a millisecond when idle, a second when something blocks it.
LOOP_LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# Gaps between streamed tokens: tens of microseconds (batched) to a second (a stalled engine).
ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.5,
)
# Workflows last longer than requests: seconds to an hour.
WORKFLOW_BUCKETS = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)


M = TypeVar("M", Counter, Gauge, Histogram)


class Series(Generic[M]):
    """A labelled metric counted on every request: each child is looked up once per label
    values (a bounded set), since prometheus_client's `labels()` checks its arguments and takes
    a lock on every call (about 1 µs, a dozen times a request)."""

    __slots__ = ("_children", "metric")

    def __init__(self, metric: M) -> None:
        self.metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class RoleLabels:
    """Maps agent roles to a bounded label set: the configured roles, "other" and "none"."""

    def __init__(self, roles: Iterable[str] = DEFAULT_ROLES) -> None:
        known = [r.strip().lower() for r in roles if r.strip()]
        if len(known) > MAX_ROLES:
            raise ValueError(f"at most {MAX_ROLES} metric roles may be configured")
        self.known = frozenset(known)

    def __call__(self, role: str | None) -> str:
        if not role:
            return NO_ROLE
        role = role.lower()
        return role if role in self.known else OTHER_ROLE


class RouterMetrics:
    def __init__(self, roles: Iterable[str] = DEFAULT_ROLES) -> None:
        self.registry = CollectorRegistry()
        self.role_label = RoleLabels(roles)
        r = self.registry
        self.requests = Series(
            Counter(
                "hiveroute_requests",
                "Requests finished, by engine, policy, endpoint and HTTP status class",
                ["engine", "policy", "endpoint", "status"],
                registry=r,
            )
        )
        self.rejected = Counter(
            "hiveroute_rejected_requests",
            "Requests refused before routing, by reason",
            ["reason"],
            registry=r,
        )
        for reason in ("overloaded", "no_engine"):  # exported as 0 from the start
            self.rejected.labels(reason)
        self.retries = Counter(
            "hiveroute_retries", "Requests retried on another engine", ["engine"], registry=r
        )
        self.in_flight = Gauge(
            "hiveroute_in_flight_requests", "Requests in flight, by engine", ["engine"], registry=r
        )
        self.ttft = Series(
            Histogram(
                "hiveroute_ttft_seconds",
                "Time to first token seen at the router (streamed) or to the response (not streamed)",
                ["engine", "policy"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.e2e = Series(
            Histogram(
                "hiveroute_e2e_latency_seconds",
                "Request latency at the router, first byte in to last byte out",
                ["engine", "policy"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.overhead = Series(
            Histogram(
                "hiveroute_router_overhead_seconds",
                "Time the router spends before sending a request upstream (parsing, routing)",
                ["policy"],
                buckets=OVERHEAD_BUCKETS,
                registry=r,
            )
        )
        self.loop_lag = Histogram(
            "hiveroute_event_loop_lag_seconds",
            "How late the router's event loop woke a timer, sampled 4 times a second per "
            "worker: the wait a request arriving then met before the router read it",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.decisions = Series(
            Counter(
                "hiveroute_routing_decisions",
                "Routing decisions by policy and reason",
                ["policy", "reason"],
                registry=r,
            )
        )
        self.prompt_tokens = Series(
            Counter(
                "hiveroute_prompt_tokens",
                "Prompt tokens, from the engines' usage",
                ["engine"],
                registry=r,
            )
        )
        self.cached_tokens = Series(
            Counter(
                "hiveroute_cached_tokens",
                "Prompt tokens served from the engines' prefix cache (usage.cached_tokens)",
                ["engine"],
                registry=r,
            )
        )
        self.cross_agent_cached_tokens = Series(
            Counter(
                "hiveroute_cross_agent_cached_tokens",
                "Cached prompt tokens whose blocks another agent of the same workflow computed",
                ["engine"],
                registry=r,
            )
        )
        self.completion_tokens = Series(
            Counter(
                "hiveroute_completion_tokens",
                "Generated tokens, from the engines' usage",
                ["engine"],
                registry=r,
            )
        )
        self.itl = Series(
            Histogram(
                "hiveroute_inter_token_latency_seconds",
                "Mean gap between a streamed response's SSE data events (one observation a request)",
                ["engine", "policy"],
                buckets=ITL_BUCKETS,
                registry=r,
            )
        )
        self.agent_requests = Series(
            Counter(
                "hiveroute_agent_requests",
                "Requests finished, by agent role (roles outside the configured set count as other)",
                ["role"],
                registry=r,
            )
        )
        self.agent_prompt_tokens = Series(
            Counter(
                "hiveroute_agent_prompt_tokens",
                "Prompt tokens by agent role",
                ["role"],
                registry=r,
            )
        )
        self.agent_cached_tokens = Series(
            Counter(
                "hiveroute_agent_cached_tokens",
                "Prompt tokens served from the engines' prefix cache, by agent role",
                ["role"],
                registry=r,
            )
        )
        self.agent_ttft = Series(
            Histogram(
                "hiveroute_agent_ttft_seconds",
                "Time to first token at the router, by agent role",
                ["role"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.workflow_ttft = Histogram(
            "hiveroute_workflow_ttft_seconds",
            "From a workflow's first request arriving to its first token",
            buckets=WORKFLOW_BUCKETS,
            registry=r,
        )
        self.workflow_completion = Histogram(
            "hiveroute_workflow_completion_seconds",
            "From a workflow's first request arriving to its last response ending (observed when "
            "the workflow ends or expires)",
            buckets=WORKFLOW_BUCKETS,
            registry=r,
        )
        self.handoff_latency = Histogram(
            "hiveroute_handoff_latency_seconds",
            "From one agent's response ending to the next agent's request in the same workflow",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.engine_up = Gauge(
            "hiveroute_engine_up", "1 if the engine is healthy, else 0", ["engine"], registry=r
        )
        self.engine_queue = Gauge(
            "hiveroute_engine_queue_depth",
            "Requests the engine is busy with as the router estimates it",
            ["engine"],
            registry=r,
        )
        self.engine_kv_usage = Gauge(
            "hiveroute_engine_kv_usage_ratio",
            "The engine's KV-cache usage as it last reported it (0..1)",
            ["engine"],
            registry=r,
        )
        self.state = StateMetrics(r)

    def forget_engine(self, engine: str) -> None:
        """The engine left the pool: its gauges go (kept, `hiveroute_engine_up` went on
        reporting a departed engine as up, and a churning pool grew them for good). Its
        counters stay: they are history, and their rates fall to 0."""
        for gauge in (self.engine_up, self.engine_queue, self.engine_kv_usage, self.in_flight):
            with contextlib.suppress(KeyError):
                gauge.remove(engine)

    def known_engine(self, engine: str) -> None:
        """Export an engine's counters as 0 before their first increment, so rates and ratios
        over them read 0 rather than "no data"."""
        for counter in (
            self.retries,
            self.prompt_tokens,
            self.cached_tokens,
            self.cross_agent_cached_tokens,
            self.completion_tokens,
        ):
            counter.labels(engine)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The current value of one sample (0 if never set), e.g. for the dashboard's JSON."""
        found = self.registry.get_sample_value(name, labels or {})
        return 0.0 if found is None else found


class StateMetrics:
    """The shared-state backend's health: whether replicas share state or serve on local state."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.backend_up = Gauge(
            "hiveroute_state_backend_up",
            "1 while the shared state backend (Redis) answers; 0 while this replica serves on "
            "local state",
            ["backend"],
            registry=registry,
        )
        self.errors = Counter(
            "hiveroute_state_errors",
            "State-backend calls that failed or timed out and fell back to local state",
            ["backend", "reason"],
            registry=registry,
        )
        self.local_operations = Counter(
            "hiveroute_state_local_operations",
            "State operations served from this replica's local state while the backend was down",
            ["backend"],
            registry=registry,
        )
        self.reconciled_keys = Counter(
            "hiveroute_state_reconciled_keys",
            "Keys written locally during an outage and reconciled when the backend returned, by "
            "result (applied, conflict: the backend's value kept, restored: the backend had "
            "lost its data and got this replica's copy)",
            ["backend", "result"],
            registry=registry,
        )

    def known_backend(self, backend: str) -> None:
        """Export the outage series as 0 from the start, so their panels read 0 before the
        first outage instead of "no data"."""
        for reason in ("connection", "timeout"):
            self.errors.labels(backend, reason)
        self.local_operations.labels(backend)
        for result in ("applied", "conflict", "restored"):
            self.reconciled_keys.labels(backend, result)
