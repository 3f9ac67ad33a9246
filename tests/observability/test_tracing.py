"""Request spans, exported to memory: attributes, W3C parenting, and what the engine receives."""

from __future__ import annotations

import json

import aiohttp
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from hiveroute.assembly import assemble
from hiveroute.config import RouterConfig
from hiveroute.observability.tracing import Tracing, build_tracing, otlp_traces_url
from hiveroute.server import RunningRouter, start_router
from tests.support.fake_engine import FakeEngine

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


async def traced_router(engines: list[FakeEngine]) -> tuple[RunningRouter, InMemorySpanExporter]:
    config = RouterConfig(
        engine=[e.url for e in engines], host="127.0.0.1", port=0, health_interval_s=0.2
    ).validate()
    router = assemble(config)
    assert router.tracing is None  # off by default
    exporter = InMemorySpanExporter()
    router.tracing = Tracing.with_exporter(exporter, batch=False)
    return await start_router(config, router=router), exporter


async def test_span_has_request_attributes_and_continues_the_callers_trace(
    fake_engines: list[FakeEngine], http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    running, exporter = await traced_router([engine])
    try:
        body = {
            "model": "m",
            "prompt": "p",
            "stream": True,
            "hiveroute": {
                "workflow_id": "wf-1",
                "agent_id": "planner-1",
                "agent_role": "planner",
                "stage": "plan",
            },
        }
        headers = {
            "Content-Type": "application/json",
            "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
            "tracestate": "vendor=1",
        }
        async with http.post(
            f"{running.url}/v1/completions", data=json.dumps(body), headers=headers
        ) as resp:
            assert resp.status == 200
            await resp.read()
    finally:
        await running.stop()
    (span,) = exporter.get_finished_spans()
    context = span.get_span_context()
    assert format(context.trace_id, "032x") == CALLER_TRACE
    assert span.parent is not None and format(span.parent.span_id, "016x") == CALLER_SPAN
    assert span.kind == SpanKind.SERVER
    attrs = dict(span.attributes or {})
    assert attrs["hiveroute.workflow.id"] == "wf-1"
    assert attrs["hiveroute.agent.id"] == "planner-1"
    assert attrs["hiveroute.agent.role"] == "planner"
    assert attrs["hiveroute.workflow.stage"] == "plan"
    assert attrs["hiveroute.engine"] == f"127.0.0.1:{engine.port}"
    assert attrs["gen_ai.usage.input_tokens"] == 10
    assert attrs["hiveroute.cached_tokens"] == 4
    assert attrs["hiveroute.cache_hit_ratio"] == 0.4
    assert attrs["http.response.status_code"] == 200
    # The engine sees the router's span as its parent, in the same trace.
    sent = engine.received_headers[0]["traceparent"]
    assert sent == f"00-{CALLER_TRACE}-{format(context.span_id, '016x')}-01"
    assert engine.received_headers[0]["tracestate"] == "vendor=1"


async def test_without_traceparent_a_new_trace_starts_and_errors_are_marked(
    fake_engines: list[FakeEngine], http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    engine.behaviour.status = 503  # the only engine answers 503: the router has none left
    running, exporter = await traced_router([engine])
    try:
        async with http.post(
            f"{running.url}/v1/completions", json={"model": "m", "prompt": "p"}
        ) as resp:
            assert resp.status == 503
        async with http.post(f"{running.url}/v1/completions", data=b"{not json") as resp:
            assert resp.status == 400
    finally:
        await running.stop()
    unavailable, bad = exporter.get_finished_spans()
    assert unavailable.parent is None
    assert unavailable.status.status_code == StatusCode.ERROR
    assert dict(unavailable.attributes or {})["http.response.status_code"] == 503
    # A client's mistake is not the router's error: recorded, not marked as a failure.
    assert dict(bad.attributes or {})["http.response.status_code"] == 400
    assert bad.status.status_code != StatusCode.ERROR


async def test_tracing_off_forwards_the_callers_traceparent_unchanged(
    fake_engines: list[FakeEngine], http: aiohttp.ClientSession
) -> None:
    engine = fake_engines[0]
    config = RouterConfig(engine=[engine.url], host="127.0.0.1", port=0).validate()
    running = await start_router(config)
    try:
        parent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
        async with http.post(
            f"{running.url}/v1/completions",
            json={"model": "m", "prompt": "p"},
            headers={"traceparent": parent},
        ) as resp:
            assert resp.status == 200
    finally:
        await running.stop()
    assert engine.received_headers[0]["traceparent"] == parent


def test_otlp_endpoint_configuration() -> None:
    assert build_tracing(None) is None
    assert otlp_traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert otlp_traces_url("http://c:4318/custom/traces") == "http://c:4318/custom/traces"
    tracing = build_tracing("http://127.0.0.1:1", service_name="router-a", sample_ratio=0.5)
    assert tracing is not None
    resource = tracing.provider.resource.attributes
    assert resource["service.name"] == "router-a"
    tracing.provider.shutdown()


async def test_otlp_flags_export_spans_to_a_collector(
    fake_engines: list[FakeEngine], http: aiohttp.ClientSession
) -> None:
    """--otlp-endpoint sends the spans over OTLP/HTTP (protobuf) when the router stops at latest."""
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    received: list[ExportTraceServiceRequest] = []

    async def collect(request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        received.append(message)
        return web.Response(content_type="application/x-protobuf", body=b"")

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    collector = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        config = RouterConfig(
            engine=[fake_engines[0].url],
            host="127.0.0.1",
            port=0,
            otlp_endpoint=collector,
            otlp_service_name="router-under-test",
        ).validate()
        running = await start_router(config)
        assert running.router.tracing is not None
        body = {"model": "m", "prompt": "p", "hiveroute": {"workflow_id": "wf-otlp"}}
        async with http.post(f"{running.url}/v1/completions", json=body) as resp:
            assert resp.status == 200
        await running.stop()  # flushes the batch
    finally:
        await runner.cleanup()
    spans = [
        (resource_spans.resource, span)
        for message in received
        for resource_spans in message.resource_spans
        for scope in resource_spans.scope_spans
        for span in scope.spans
    ]
    assert len(spans) == 1
    resource, span = spans[0]
    service = {a.key: a.value.string_value for a in resource.attributes}["service.name"]
    assert service == "router-under-test"
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["hiveroute.workflow.id"].string_value == "wf-otlp"
    assert attrs["gen_ai.usage.input_tokens"].int_value == 10


async def test_client_that_goes_away_ends_the_span_as_499(
    fake_engines: list[FakeEngine], http: aiohttp.ClientSession
) -> None:
    import asyncio

    engine = fake_engines[0]
    engine.behaviour.hold_after_chunk = 0
    running, exporter = await traced_router([engine])
    try:
        resp = await http.post(
            f"{running.url}/v1/completions", json={"model": "m", "prompt": "p", "stream": True}
        )
        await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=10)
        resp.close()  # the client goes away mid-stream
        await asyncio.wait_for(engine.stream_closed_by_client.wait(), timeout=10)
        for _ in range(100):  # the handler ends its span as it unwinds
            if exporter.get_finished_spans():
                break
            await asyncio.sleep(0.05)
    finally:
        await running.stop()
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes or {})["http.response.status_code"] == 499
    assert span.status.status_code == StatusCode.ERROR
