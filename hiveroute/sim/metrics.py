"""An engine's `/metrics`: vLLM's metric names and labels, values true to what it did."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

# vLLM's own bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")


class Histogram(Collector):
    """A labelled histogram cheap enough to observe once per generated token.

    prometheus_client's takes a lock and walks the buckets on every observation; the step loop
    observes inter-token latency for every token of every stream, so this one only bisects.
    """

    def __init__(
        self, name: str, doc: str, labels: dict[str, str], buckets: tuple[float, ...]
    ) -> None:
        self.name = name
        self.doc = doc
        self.labels = labels
        self.bounds = list(buckets)
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.doc, labels=list(self.labels))
        cumulative, buckets = 0, []
        for bound, count in zip([*self.bounds, float("inf")], self.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        family.add_metric(list(self.labels.values()), buckets, self.sum)
        yield family


class EngineMetrics:
    """One engine's registry (no global state: several engines share a process)."""

    def __init__(
        self, model_name: str, engine_index: int, *, num_gpu_blocks: int, block_size: int
    ) -> None:
        self.registry = CollectorRegistry()
        labels = ("model_name", "engine")
        values = (model_name, str(engine_index))
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            collector = Histogram(name, doc, dict(zip(labels, values, strict=True)), buckets)
            r.register(collector)
            return collector

        # vLLM exports its CacheConfig as the labels of an info gauge (value 1); routers read the
        # cache's size from it
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ("num_gpu_blocks", "block_size", "enable_prefix_caching"),
            registry=r,
        ).labels(str(num_gpu_blocks), str(block_size), "True").set(1)
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            E2E_BUCKETS,
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*labels, "finished_reason"),
            registry=r,
        )
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}

    def render(self) -> bytes:
        return generate_latest(self.registry)
