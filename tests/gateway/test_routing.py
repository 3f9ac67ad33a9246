from collections import Counter

import pytest

from hiveroute.engines.engine import EngineSpec
from hiveroute.engines.pool import EnginePool
from hiveroute.errors import ConfigError, NoEngineAvailable
from hiveroute.metadata import RequestMetadata
from hiveroute.routing.base import CycleState, RoutingRequest
from hiveroute.routing.registry import PluginContext, build_policy


def make_pool(n: int) -> EnginePool:
    return EnginePool([EngineSpec(url=f"http://10.0.0.{i}:8000") for i in range(n)])


def request(session: str | None = None, workflow: str | None = None) -> RoutingRequest:
    meta = RequestMetadata(session_id=session, workflow_id=workflow)
    return RoutingRequest(
        request_id="r", path="/v1/completions", body={"prompt": "x"}, metadata=meta
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


def test_no_candidates_is_no_engine_available() -> None:
    pool = make_pool(1)
    policy = build_policy("least_load", PluginContext(pool))
    with pytest.raises(NoEngineAvailable):
        policy.choose(request(), [], CycleState())
