"""Prefixes many contexts share (routing/sharing.py) and what the decision makes of them
(routing/cost.py: the copy amendment, and costs equal within the predictor's error). A clock
the test moves."""

import pytest

from hiveroute.engines.engine import Engine, EngineSpec
from hiveroute.kvindex.index import KvIndex
from hiveroute.metadata import RequestMetadata
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.base import CycleState, RoutingRequest
from hiveroute.routing.cost import BUILT_ON_KEY, CachedPrompt, RoutingCost
from hiveroute.routing.live_set import LiveSet
from hiveroute.routing.retention import Retention
from hiveroute.routing.sharing import SharedPrefixes, context_of
from hiveroute.routing.ttft import TtftPredictor
from hiveroute.routing.ttft_ledger import TtftLedger

BS = 16


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_prefix_counts_the_distinct_contexts_that_built_on_it_lately() -> None:
    clock = Clock()
    sharing = SharedPrefixes(window_s=30.0, clock=clock)
    assert sharing.contexts(7) == 0
    for context in ["s1", "s2", "s2", "s3"]:  # s2's second turn is the same context
        sharing.built_on(7, context)
    assert sharing.contexts(7) == 3
    assert sharing.contexts(7, besides="s2") == 2  # the asker is no evidence for itself
    assert sharing.contexts(7, besides="s9") == 3
    clock.now = 20.0
    sharing.built_on(7, "s4")
    clock.now = 35.0  # s1-s3 built on it more than a window ago
    assert sharing.contexts(7) == 1


def test_prefixes_and_contexts_per_prefix_are_bounded() -> None:
    sharing = SharedPrefixes(clock=lambda: 0.0, max_prefixes=2, max_contexts=3)
    for prefix in (1, 2, 3):
        sharing.built_on(prefix, "s")
    assert len(sharing) == 2 and sharing.contexts(1) == 0  # the least recent was dropped
    for context in range(10):
        sharing.built_on(3, context)
    assert sharing.contexts(3) == 3


def test_a_context_is_its_workflow_else_its_session_else_the_request() -> None:
    def request(rid: str, **meta: str) -> RoutingRequest:
        return RoutingRequest(rid, "/v1/completions", {}, RequestMetadata(**meta), tenant="t")

    siblings = [request(r, workflow_id="w", session_id=r) for r in ("a", "b")]
    assert context_of(siblings[0]) == context_of(siblings[1])  # one workflow's fan-out
    turns = [request(r, session_id="chat-1") for r in ("t1", "t2")]
    assert context_of(turns[0]) == context_of(turns[1])
    assert context_of(request("x")) != context_of(request("y"))


def pricing(clock: Clock) -> tuple[RoutingCost, list[Engine]]:
    predictor = TtftPredictor(base_s=0.01, queue_s_per_request=0.02, prefill_s_per_token=1e-4)
    ledger = TtftLedger(predictor, PrefillBacklog(clock=clock))
    cost = RoutingCost(
        ledger,
        LiveSet(clock=clock),
        KvIndex(),
        Retention(clock=clock),
        SharedPrefixes(clock=clock),
    )
    return cost, [Engine(EngineSpec(f"http://127.0.0.1:{8100 + i}")) for i in range(4)]


def test_a_prefix_more_contexts_than_engines_share_is_priced_as_held_everywhere() -> None:
    """A system prompt one engine caches: while few sessions built on it, the others are
    priced without it (copying it would serve few); once more sessions than engines did, the
    copy serves its share of many, and every engine is priced as holding it."""
    clock = Clock()
    cost, engines = pricing(clock)
    keys = list(range(100, 180))  # an 80-block prompt; the first 60 blocks are the prompt
    held = {
        e.name: CachedPrompt(gpu_tokens=60 * BS if i == 0 else 0) for i, e in enumerate(engines)
    }
    for session in range(4):  # four sessions (one per engine) built on it so far
        state = CycleState()
        priced = cost.with_copies(held, keys, BS, ("t", f"s{session}"), state)
        assert priced == held
        assert state[BUILT_ON_KEY] == (keys[59], ("t", f"s{session}"))
        cost.routed(engines[0], keys, {}, state)
    priced = cost.with_copies(held, keys, BS, ("t", "s0"), CycleState())
    assert priced == held  # a fifth request of one of them: still four contexts
    priced = cost.with_copies(held, keys, BS, ("t", "s4"), CycleState())
    assert all(p.tokens == 60 * BS for p in priced.values())  # a fifth session
    prices = [cost.price(e, 80 * BS, priced[e.name]) for e in engines]
    assert len({round(p.total_s, 9) for p in prices}) == 1  # new sessions: load decides
    clock.now = 60.0  # the sessions are over: the prefix is one engine's again
    assert cost.with_copies(held, keys, BS, ("t", "s5"), CycleState()) == held


def test_a_conversations_own_history_is_never_priced_as_copied() -> None:
    clock = Clock()
    cost, engines = pricing(clock)
    keys = list(range(500, 540))
    held = {
        e.name: CachedPrompt(gpu_tokens=30 * BS if i == 1 else 0) for i, e in enumerate(engines)
    }
    for _turn in range(10):  # one session's turns all build on its own history
        state = CycleState()
        assert cost.with_copies(held, keys, BS, ("t", "chat-1"), state) == held
        cost.routed(engines[1], keys, {}, state)


def test_costs_within_the_predictions_error_go_to_the_emptier_engine() -> None:
    """A prefix saving 2 % of the cost on an engine holding 50 live blocks, against an empty
    engine: with exact predictions the saving decides; when the measured TTFTs missed their
    predictions by 10 %, 2 % is no clear benefit, and the emptier engine gets the request."""
    clock = Clock()
    cost, engines = pricing(clock)
    holder, empty = engines[0], engines[1]
    cost.live.touch(holder.name, list(range(50)))
    prices = [
        cost.price(holder, 1000, CachedPrompt(gpu_tokens=10)),
        cost.price(empty, 1000, CachedPrompt()),
    ]
    assert prices[0].total_s < prices[1].total_s < prices[0].total_s * 1.05
    assert cost.cheapest(prices).engine is holder
    predictor = cost.ledger.predictor
    predictor.observe(empty.name, queue_depth=0, uncached_tokens=1000, ttft_s=0.11)
    for i in range(50):  # what the engines measured: 10 % either side of the prediction
        predicted = predictor.predict(empty.name, queue_depth=0, uncached_tokens=1000)
        ttft = predicted * (1.1 if i % 2 else 1 / 1.1)
        predictor.observe(empty.name, queue_depth=0, uncached_tokens=1000, ttft_s=ttft)
    assert predictor.relative_error() == pytest.approx(0.09, rel=0.3)
    prices = [
        cost.price(holder, 1000, CachedPrompt(gpu_tokens=10)),
        cost.price(empty, 1000, CachedPrompt()),
    ]
    assert cost.cheapest(prices).engine is empty
    assert cost.cheapest(prices, prefer=[holder.name]).engine is holder  # a workflow's home
    far = cost.price(empty, 1000, CachedPrompt(gpu_tokens=900))  # a clear benefit still wins
    assert cost.cheapest([prices[0], far]).engine is empty
    assert cost.cheapest([far, prices[0]], prefer=[holder.name]).engine is empty


def test_the_band_of_equal_costs_is_the_predictors_error_of_a_ttft_not_of_the_whole_sum() -> None:
    """A new 2,000-token context, and an engine that is emptier but has as long a prefill
    queued: its predicted TTFT is about twice the idle engine's. The delay and eviction terms
    are alike on both, so the sums differ by a quarter; with the predictor 40 % off lately, a
    band of 40 % of the sum would call them equal and send the request to the emptier engine,
    behind the queued prefill. The predictor is unsure of the TTFT only: 40 % of the idle
    engine's TTFT is less than the queue costs, and the idle engine gets it."""
    clock = Clock()
    cost, engines = pricing(clock)
    queued, idle, learner = engines[0], engines[1], engines[2]
    queued.kv_capacity_blocks = idle.kv_capacity_blocks = 400
    cost.live.touch(queued.name, list(range(300)))  # three quarters of its cache live
    cost.live.touch(idle.name, list(range(1000, 1400)))  # all of it live
    cost.ledger.routed(queued, 2000, CycleState())  # a 2,000-token prefill queued there
    predictor = cost.ledger.predictor
    for i in range(50):  # what another engine measured: 40 % either side of the prediction
        predicted = predictor.predict(learner.name, queue_depth=0, uncached_tokens=2000)
        ttft = predicted / 0.6 if i % 2 else predicted * 0.6
        predictor.observe(learner.name, queue_depth=0, uncached_tokens=2000, ttft_s=ttft)
    error = predictor.relative_error()
    assert error == pytest.approx(0.4, abs=0.02)
    busy, free = cost.price(queued, 2000, CachedPrompt()), cost.price(idle, 2000, CachedPrompt())
    assert busy.ttft_s > 1.8 * free.ttft_s  # the queued prefill
    assert busy.live_blocks < free.live_blocks  # the emptier engine, were they equal
    assert free.total_s < busy.total_s <= free.total_s * (1.0 + error)  # within 40 % of the sum
    assert busy.total_s > free.total_s + error * free.ttft_s  # not within 40 % of the TTFT
    assert cost.cheapest([busy, free]).engine is idle
    assert cost.cheapest([free, busy], prefer=[queued.name]).engine is idle  # nor for a home
