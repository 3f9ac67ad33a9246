import asyncio
from collections import Counter

import pytest

from hiveroute.engines.engine import Engine, EngineSpec
from hiveroute.engines.pool import EnginePool
from hiveroute.errors import ConfigError, NoEngineAvailable
from hiveroute.metadata import RequestMetadata
from hiveroute.routing.base import CycleState, RequestOutcome, RoutingRequest
from hiveroute.routing.pickers import MaxScorePicker
from hiveroute.routing.policy import Policy
from hiveroute.routing.registry import PluginContext, build_policy


def make_pool(n: int) -> EnginePool:
    return EnginePool([EngineSpec(url=f"http://10.0.0.{i}:8000") for i in range(n)])


def request(
    session: str | None = None, workflow: str | None = None, *, request_id: str = "r"
) -> RoutingRequest:
    meta = RequestMetadata(session_id=session, workflow_id=workflow)
    return RoutingRequest(
        request_id=request_id, path="/v1/completions", body={"prompt": "x"}, metadata=meta
    )


def choose(policy_name: str, pool: EnginePool, req: RoutingRequest) -> str:
    policy = build_policy(policy_name, PluginContext(pool))
    return policy.choose(req, pool.candidates(None), CycleState()).engine.name


def test_round_robin_cycles_through_every_engine() -> None:
    pool = make_pool(3)
    policy = build_policy("round_robin", PluginContext(pool))
    picks = [
        policy.choose(request(), pool.candidates(None), CycleState()).engine.name for _ in range(6)
    ]
    assert Counter(picks) == {e.name: 2 for e in pool.engines}
    assert picks[:3] != picks[3:4] * 3


def test_least_load_prefers_fewer_in_flight_and_counts_foreign_load() -> None:
    pool = make_pool(3)
    a, b, c = pool.engines
    a.load.in_flight, b.load.in_flight, c.load.in_flight = 5, 1, 2
    assert choose("least_load", pool, request()) == b.name
    b.load.running, b.load.waiting, b.load.in_flight_at_scrape = 10, 4, 1  # 13 requests not ours
    assert choose("least_load", pool, request()) == c.name


def test_session_is_sticky_and_spreads_keys() -> None:
    pool = make_pool(4)
    homes = {choose("session", pool, request(session=f"s{i}")) for i in range(40)}
    assert len(homes) >= 3  # keys spread over the ring
    first = choose("session", pool, request(session="s7"))
    assert all(choose("session", pool, request(session="s7")) == first for _ in range(5))
    assert choose("session", pool, request(workflow="w1")) == choose(
        "session", pool, request(workflow="w1")
    )


def test_session_bounded_load_spills_a_hot_session() -> None:
    pool = make_pool(3)
    policy = build_policy("session", PluginContext(pool))
    home_name = choose("session", pool, request(session="hot"))
    home = pool.get(home_name)
    assert home is not None
    home.load.in_flight = 20  # far above 1.25 × average
    state = CycleState()
    decision = policy.choose(request(session="hot"), pool.candidates(None), state)
    assert decision.engine.name != home_name
    assert decision.reason == "session_spill"


def test_removing_an_engine_moves_only_its_keys() -> None:
    pool = make_pool(4)
    before = {f"s{i}": choose("session", pool, request(session=f"s{i}")) for i in range(60)}
    gone = pool.engines[0].name
    pool.remove(gone)
    after = {k: choose("session", pool, request(session=k)) for k in before}
    moved = [k for k in before if before[k] != after[k]]
    assert all(before[k] == gone for k in moved)


def test_custom_policy_from_spec_and_errors() -> None:
    pool = make_pool(2)
    custom = {"mine": {"scorers": [{"name": "load", "weight": 2}], "picker": "max_score"}}
    policy = build_policy("mine", PluginContext(pool), custom)
    assert policy.name == "mine" and policy.scorers[0].weight == 2
    with pytest.raises(ConfigError, match="unknown policy"):
        build_policy("nope", PluginContext(pool))
    with pytest.raises(ConfigError, match="unknown plugin"):
        build_policy("x", PluginContext(pool), {"x": {"scorers": ["telepathy"]}})
    with pytest.raises(ConfigError, match="not a Picker"):
        build_policy("x", PluginContext(pool), {"x": {"picker": "load"}})
    with pytest.raises(ConfigError, match="bad parameters"):
        build_policy("x", PluginContext(pool), {"x": {"scorers": [{"name": "load", "speed": 1}]}})
    # a spec of the wrong shape is a ConfigError that says what is expected, not a traceback
    with pytest.raises(ConfigError, match="expected"):
        build_policy("x", PluginContext(pool), {"x": "load"})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="scorers must be a list"):
        build_policy("x", PluginContext(pool), {"x": {"scorers": {"name": "load"}}})
    for weight in ("heavy", -1, float("nan"), True):
        with pytest.raises(ConfigError, match="weight must be a number"):
            spec = {"x": {"scorers": [{"name": "load", "weight": weight}]}}
            build_policy("x", PluginContext(pool), spec)


def test_no_candidates_is_no_engine_available() -> None:
    pool = make_pool(1)
    policy = build_policy("least_load", PluginContext(pool))
    with pytest.raises(NoEngineAvailable):
        policy.choose(request(), [], CycleState())


class _Heard(MaxScorePicker):
    """A picker that records the bookkeeping calls it hears, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.heard: list[tuple[str, str]] = []

    def on_routed(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        self.heard.append(("routed", request.request_id))

    def on_first_token(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
        self.heard.append(("first_token", request.request_id))

    def on_completed(
        self, request: RoutingRequest, outcome: RequestOutcome, state: CycleState
    ) -> None:
        self.heard.append(("completed", request.request_id))


async def test_a_request_sent_at_once_leaves_its_bookkeeping_until_its_bytes_are_out() -> None:
    """decide_then_send: `on_routed` runs two loop turns later (aiohttp writes a request on the
    turn after it is sent), or before anything else the policy does, in order."""
    pool = make_pool(2)
    picker = _Heard()
    policy = Policy("p", picker=picker)
    candidates = pool.candidates(None)
    policy.decide_then_send(request(request_id="a"), candidates, CycleState())
    assert picker.heard == []  # not on the request's own path
    await asyncio.sleep(0)
    assert picker.heard == []  # the turn aiohttp writes the request on
    await asyncio.sleep(0)
    assert picker.heard == [("routed", "a")]

    policy.decide_then_send(request(request_id="b"), candidates, CycleState())
    c_state = CycleState()
    policy.decide_then_send(
        request(request_id="c"), candidates, c_state
    )  # b is heard before c decides
    assert picker.heard[-1] == ("routed", "b")
    policy.on_completed(request(request_id="c"), RequestOutcome(engine=None, status=502), c_state)
    assert picker.heard[-2:] == [("routed", "c"), ("completed", "c")]  # routed, then completed


async def test_a_failing_deferred_bookkeeping_is_logged_and_the_rest_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Failing(_Heard):
        def on_routed(self, request: RoutingRequest, engine: Engine, state: CycleState) -> None:
            if request.request_id == "bad":
                raise RuntimeError("bookkeeping broke")
            super().on_routed(request, engine, state)

    pool = make_pool(2)
    picker = Failing()
    policy = Policy("p", picker=picker)
    policy.decide_then_send(request(request_id="bad"), pool.candidates(None), CycleState())
    policy.decide_then_send(request(request_id="good"), pool.candidates(None), CycleState())
    policy.catch_up()
    assert picker.heard == [("routed", "good")]
    assert "on_routed failed" in caplog.text and "bookkeeping broke" in caplog.text


async def test_a_first_token_or_an_end_waits_for_its_own_bookkeeping_only() -> None:
    """A burst's first answer does not carry the bookkeeping of every request decided since."""
    pool = make_pool(2)
    picker = _Heard()
    policy = Policy("p", picker=picker)
    candidates = pool.candidates(None)
    a_state, b_state = CycleState(), CycleState()
    policy.decide_then_send(request(request_id="a"), candidates, a_state)
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # a's bookkeeping is done
    policy.decide_then_send(request(request_id="b"), candidates, b_state)  # b's is pending
    engine = pool.engines[0]
    policy.on_first_token(request(request_id="a"), engine, a_state)
    policy.on_completed(request(request_id="a"), RequestOutcome(engine=engine, status=200), a_state)
    assert picker.heard == [
        ("routed", "a"),
        ("first_token", "a"),
        ("completed", "a"),
    ]  # b's stays pending
    policy.on_first_token(request(request_id="b"), engine, b_state)  # b's own: caught up first
    assert picker.heard[-2:] == [("routed", "b"), ("first_token", "b")]
