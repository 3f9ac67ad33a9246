"""A plugin or request hook that raises after a request was sent does not undo the request.

The request is being served (or is over) by then: every other plugin and hook must still hear
of it (a prefill left counted on an engine makes it look busy for good), and the client, the
access log and the counters must see it as it went.
"""

from __future__ import annotations

import logging

import aiohttp
import pytest

from hiveroute.engines.engine import Engine, EngineSpec
from hiveroute.gateway.pipeline import ServedHook
from hiveroute.metadata import RequestMetadata
from hiveroute.routing.base import CycleState, RequestOutcome, RoutingRequest, Scorer
from hiveroute.routing.pickers import MaxScorePicker
from hiveroute.routing.policy import Policy, WeightedScorer
from tests.conftest import RouterFactory
from tests.support.access import access_lines
from tests.support.fake_engine import FakeEngine


class Failing(Scorer):
    name = "failing"

    def score(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> dict[str, float]:
        return {}

    def on_first_token(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        raise RuntimeError("broken plugin")

    def on_completed(
        self, request: RoutingRequest, outcome: RequestOutcome, state: CycleState
    ) -> None:
        raise RuntimeError("broken plugin")


class Listening(Scorer):
    name = "listening"

    def __init__(self) -> None:
        self.heard: list[str] = []

    def score(
        self, request: RoutingRequest, candidates: list[Engine], state: CycleState
    ) -> dict[str, float]:
        return {}

    def on_first_token(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        self.heard.append("first token")

    def on_completed(
        self, request: RoutingRequest, outcome: RequestOutcome, state: CycleState
    ) -> None:
        self.heard.append("completed")


def test_every_plugin_hears_a_request_end_when_one_before_it_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listening = Listening()
    policy = Policy(
        "p",
        scorers=[WeightedScorer(Failing()), WeightedScorer(listening)],
        picker=MaxScorePicker(),
    )
    engine = Engine(spec=EngineSpec(url="http://10.0.0.1:8000"))
    request = RoutingRequest(
        request_id="r", path="/v1/completions", body={"prompt": "x"}, metadata=RequestMetadata()
    )
    state = CycleState()
    policy.on_first_token(request, engine, state)
    policy.on_completed(request, RequestOutcome(engine=engine, status=200), state)
    assert listening.heard == ["first token", "completed"]
    assert [r.exc_info[1].args for r in caplog.records if r.exc_info] == [("broken plugin",)] * 2


async def test_a_hook_failing_after_a_request_leaves_its_answer_and_its_log_line(
    fake_engines: list[FakeEngine],
    router_factory: RouterFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: ServedHook, request: RoutingRequest, outcome: RequestOutcome) -> None:
        raise RuntimeError("broken hook")

    monkeypatch.setattr(ServedHook, "after_complete", broken)
    caplog.set_level(logging.INFO, logger="hiveroute.access")
    router = await router_factory([e.url for e in fake_engines], policy="round_robin")
    body = {"model": "m", "prompt": "p", "max_tokens": 3}
    async with http.post(
        f"{router.url}/v1/completions", json=body, headers={"X-Request-Id": "hooked-1"}
    ) as response:
        assert response.status == 200
        assert (await response.json())["choices"]
    [line] = access_lines(caplog, "hooked-1")
    assert line["status"] == 200 and line["engine"] is not None
    assert "broken hook" in caplog.text
