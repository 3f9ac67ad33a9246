"""OpenTelemetry: one span per routed request, parented by the caller's W3C `traceparent`.

Off by default and free when off: the gateway holds `Tracing | None` and skips every call on
None, and OpenTelemetry is imported only when tracing is configured. When on, the router's span
context (not the caller's) is what the engine receives in `traceparent`, so the engine's own
spans hang under the router's. The router builds its own TracerProvider (no global one), so
several routers in one process, and tests, keep their spans apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from hiveroute.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span

    from hiveroute.gateway.router import Router
    from hiveroute.metadata import RequestMetadata
    from hiveroute.routing.base import RequestOutcome

log = logging.getLogger("hiveroute.tracing")

TRACE_HEADERS = ("traceparent", "tracestate")
EXPORT_TIMEOUT_S = 5.0  # one OTLP export, retries included
SHUTDOWN_TIMEOUT_S = 3.0  # how long stopping the router waits for the last spans to leave


@dataclass(frozen=True)
class TracingSettings:
    endpoint: str  # OTLP/HTTP traces endpoint, e.g. http://collector:4318/v1/traces
    service_name: str = "hiveroute"
    sample_ratio: float = 1.0
    headers: Mapping[str, str] | None = None


def otlp_traces_url(endpoint: str) -> str:
    """Accept a collector's base URL (``http://host:4318``) or its full traces URL."""
    split = urlsplit(endpoint)
    if split.scheme not in ("http", "https") or not split.hostname:
        raise ConfigError(
            f"otlp_endpoint {endpoint!r} must be an http(s) URL such as http://localhost:4318"
        )
    if split.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


class Tracing:
    """Makes request spans; a router Component so its exporter is flushed on shutdown."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("hiveroute")
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def with_exporter(
        cls,
        exporter: SpanExporter,
        *,
        service_name: str = "hiveroute",
        batch: bool = True,
        sample_ratio: float = 1.0,
    ) -> Tracing:
        """A Tracing that sends spans to `exporter` (batched in a background thread, or not)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}),
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
        )
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
        return cls(provider)

    def start_span(self, method: str, path: str, headers: Mapping[str, str]) -> RequestSpan:
        """A SERVER span for one request, child of the caller's `traceparent` if it sent one."""
        from opentelemetry.trace import SpanKind

        carrier = {k: headers[k] for k in TRACE_HEADERS if k in headers}
        parent = self.propagator.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        )
        return RequestSpan(span, self)

    async def start(self, router: Router) -> None:
        """Component.start (gateway/router.py): the span processors run on their own."""

    async def stop(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Flush and close the exporter, waiting at most `timeout_s`: an unreachable collector
        must not hold up the router's shutdown (a daemon thread finishes or is dropped)."""
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def shutdown() -> None:
            try:
                self.provider.shutdown()
            finally:
                with contextlib.suppress(RuntimeError):  # the loop may be gone already
                    loop.call_soon_threadsafe(done.set)

        threading.Thread(target=shutdown, name="hiveroute-trace-shutdown", daemon=True).start()
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        except TimeoutError:
            log.warning("trace exporter did not flush within %.0f s; dropping its spans", timeout_s)


def build_tracing(
    endpoint: str | None,
    service_name: str = "hiveroute",
    sample_ratio: float = 1.0,
    headers: Mapping[str, str] | None = None,
) -> Tracing | None:
    """Tracing that exports over OTLP/HTTP, or None (no cost at all) when no endpoint is set."""
    if not endpoint:
        return None
    if not 0.0 <= sample_ratio <= 1.0:
        raise ConfigError(f"otlp_sample_ratio must be between 0 and 1, got {sample_ratio}")
    url = otlp_traces_url(endpoint)
    from hiveroute.extras import require

    require("opentelemetry.sdk.trace", "otel")
    exporters = require("opentelemetry.exporter.otlp.proto.http.trace_exporter", "otel")
    exporter = exporters.OTLPSpanExporter(
        endpoint=url, headers=dict(headers or {}), timeout=EXPORT_TIMEOUT_S
    )
    log.info("exporting traces over OTLP to %s", url)
    return Tracing.with_exporter(exporter, service_name=service_name, sample_ratio=sample_ratio)


class RequestSpan:
    """One request's span, filled in as the request is parsed, routed and answered."""

    def __init__(self, span: Span, tracing: Tracing) -> None:
        self.span = span
        self._tracing = tracing

    def inject(self, headers: dict[str, str]) -> None:
        """Replace the caller's trace headers with this span's context for the engine."""
        from opentelemetry.trace import set_span_in_context

        for name in TRACE_HEADERS:
            headers.pop(name, None)
        self._tracing.propagator.inject(headers, context=set_span_in_context(self.span))

    def set_request(self, request_id: str, model: str | None, metadata: RequestMetadata) -> None:
        attrs: dict[str, Any] = {"hiveroute.request.id": request_id}
        if model is not None:
            attrs["gen_ai.request.model"] = model
        for key, value in (
            ("hiveroute.workflow.id", metadata.workflow_id),
            ("hiveroute.agent.id", metadata.agent_id),
            ("hiveroute.agent.role", metadata.agent_role),
            ("hiveroute.workflow.stage", metadata.stage),
            ("hiveroute.session.id", metadata.session_id),
            ("hiveroute.parent_request.id", metadata.parent_request_id),
        ):
            if value is not None:
                attrs[key] = value
        self.span.set_attributes(attrs)

    def set_routed(self, engine: str, policy: str, reason: str, attempt: int) -> None:
        self.span.set_attributes(
            {
                "hiveroute.engine": engine,
                "hiveroute.policy": policy,
                "hiveroute.routing.reason": reason,
                "hiveroute.routing.attempt": attempt,
            }
        )

    def set_outcome(self, outcome: RequestOutcome, stream: bool) -> None:
        from opentelemetry.trace import Status, StatusCode

        attrs: dict[str, Any] = {
            "http.response.status_code": outcome.status,
            "hiveroute.stream": stream,
        }
        for key, value in (
            ("gen_ai.usage.input_tokens", outcome.prompt_tokens),
            ("gen_ai.usage.output_tokens", outcome.completion_tokens),
            ("hiveroute.cached_tokens", outcome.cached_tokens),
            ("hiveroute.ttft_s", outcome.ttft_s),
        ):
            if value is not None:
                attrs[key] = value
        if outcome.prompt_tokens and outcome.cached_tokens is not None:
            attrs["hiveroute.cache_hit_ratio"] = outcome.cached_tokens / outcome.prompt_tokens
        self.span.set_attributes(attrs)
        if outcome.error is not None or outcome.status >= 500:
            self.span.set_status(Status(StatusCode.ERROR, outcome.error or str(outcome.status)))

    def set_attribute(self, key: str, value: str | int | float | bool) -> None:
        """For other parts (the workflow registry) to add what they know, e.g. cross-agent hits."""
        self.span.set_attribute(key, value)

    def fail(self, status: int, message: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("http.response.status_code", status)
        if status >= 500 or status == 499:
            self.span.set_status(Status(StatusCode.ERROR, message))

    def end(self) -> None:
        self.span.end()
