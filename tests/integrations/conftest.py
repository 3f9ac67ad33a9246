"""Fixtures for the integration tests: a router on a free port that records what it parsed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from hiveroute.metadata import RequestMetadata
from hiveroute.routing.base import RequestOutcome, RoutingRequest
from tests.conftest import RouterFactory
from tests.support.fake_engine import FakeEngine


@dataclass
class MetadataRecorder:
    """A router request hook that keeps each request's id, body and parsed metadata."""

    seen: list[tuple[str, dict[str, object], RequestMetadata]] = field(default_factory=list)

    async def before_route(self, request: RoutingRequest) -> None:
        self.seen.append((request.request_id, request.body, request.metadata))

    def after_complete(self, request: RoutingRequest, outcome: RequestOutcome) -> None:
        return None

    def by_prompt(self) -> dict[str, RequestMetadata]:
        return {str(body.get("prompt")): metadata for _, body, metadata in self.seen}


@dataclass
class RecordingRouter:
    url: str
    recorder: MetadataRecorder


@pytest.fixture
async def recording_router(
    fake_engines: list[FakeEngine], router_factory: RouterFactory
) -> AsyncIterator[RecordingRouter]:
    running = await router_factory([e.url for e in fake_engines])
    recorder = MetadataRecorder()
    running.router.pipeline.hooks.append(recorder)
    yield RecordingRouter(url=running.url, recorder=recorder)


@dataclass
class ApiStack:
    """A router (with its workflow and context API) in front of engines; `url` is the router."""

    url: str
    engines: list[FakeEngine]
    recorder: MetadataRecorder


@pytest.fixture
async def api_stack(
    fake_engines: list[FakeEngine], router_factory: RouterFactory
) -> AsyncIterator[ApiStack]:
    running = await router_factory([e.url for e in fake_engines])
    recorder = MetadataRecorder()
    running.router.pipeline.hooks.append(recorder)
    yield ApiStack(url=running.url, engines=fake_engines, recorder=recorder)


@pytest.fixture
async def sim_api_stack(router_factory: RouterFactory) -> AsyncIterator[ApiStack]:
    """The same stack in front of two simulated engines (real prefix caching, chat templates)."""
    from hiveroute.sim import SimConfig, SimFleet

    fleet = SimFleet(
        SimConfig(engines=2, base_port=0, events_base_port=0, preset="fast", host="127.0.0.1")
    )
    await fleet.start()
    try:
        running = await router_factory(fleet.engine_spec_texts())
        recorder = MetadataRecorder()
        running.router.pipeline.hooks.append(recorder)
        yield ApiStack(url=running.url, engines=[], recorder=recorder)
    finally:
        await fleet.stop()
