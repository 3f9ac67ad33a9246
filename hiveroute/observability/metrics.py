"""The router's own Prometheus metrics, all under ``hiveroute_``.

Labels are only ever bounded sets (engine, policy, status class, reason, endpoint): never a
workflow id, request id or prompt. Each router builds its own registry, so tests and several
routers in one process do not collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "hiveroute_requests",
            "Requests finished, by engine, policy, endpoint and HTTP status class",
            ["engine", "policy", "endpoint", "status"],
            registry=r,
        )
        self.rejected = Counter(
            "hiveroute_rejected_requests",
            "Requests refused before routing, by reason",
            ["reason"],
            registry=r,
        )
        self.retries = Counter(
            "hiveroute_retries", "Requests retried on another engine", ["engine"], registry=r
        )
        self.in_flight = Gauge(
            "hiveroute_in_flight_requests", "Requests in flight, by engine", ["engine"], registry=r
        )
        self.ttft = Histogram(
            "hiveroute_ttft_seconds",
            "Time to first token seen at the router (streamed) or to the response (not streamed)",
            ["engine", "policy"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "hiveroute_e2e_latency_seconds",
            "Request latency at the router, first byte in to last byte out",
            ["engine", "policy"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "hiveroute_router_overhead_seconds",
            "Time the router spends before sending a request upstream (parsing, routing)",
            ["policy"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            "hiveroute_routing_decisions",
            "Routing decisions by policy and reason",
            ["policy", "reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "hiveroute_prompt_tokens",
            "Prompt tokens, from the engines' usage",
            ["engine"],
            registry=r,
        )
        self.cached_tokens = Counter(
            "hiveroute_cached_tokens",
            "Prompt tokens served from the engines' prefix cache (usage.cached_tokens)",
            ["engine"],
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

    def render(self) -> bytes:
        return generate_latest(self.registry)
