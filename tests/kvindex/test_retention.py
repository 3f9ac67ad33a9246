"""What each engine's cache kept of the prompts that came back, and what the cost model makes
of it (routing/retention.py, routing/cost.py's `lost` term). A clock the test moves."""

import math

import pytest

from hiveroute.engines.engine import Engine, EngineSpec
from hiveroute.kvindex.index import KvIndex, PrefixMatch
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.base import CycleState
from hiveroute.routing.cost import CachedPrompt, RoutingCost
from hiveroute.routing.live_set import LiveSet
from hiveroute.routing.retention import Retention
from hiveroute.routing.ttft import TtftPredictor
from hiveroute.routing.ttft_ledger import TtftLedger

BS = 16


def held(blocks: int) -> PrefixMatch:
    return PrefixMatch(block_size=BS, gpu_blocks=blocks)


def route(retention: Retention, engine: str, keys: list[int], found: dict[str, int]) -> None:
    """One request: observed (what the engines held of it), then placed on `engine`."""
    retention.observe(keys, {name: held(blocks) for name, blocks in found.items()})
    retention.placed(engine, keys)


def test_a_return_is_a_prompt_that_extends_an_earlier_one() -> None:
    retention = Retention(clock=lambda: 0.0)
    route(retention, "a", [1, 2, 3], {})
    route(retention, "b", [7, 8], {})
    placed = retention.previous([1, 2, 3, 4, 5])  # the next turn of the first
    assert placed is not None and (placed.engine, placed.blocks) == ("a", 3)
    assert retention.previous([1, 2, 9]) is None  # shares a prefix, but is another prompt
    assert retention.previous([]) is None


def test_what_an_engine_kept_is_the_share_of_returning_blocks_it_still_held() -> None:
    retention = Retention(clock=lambda: 0.0)
    assert retention.kept("a") == 1.0  # nothing came back yet: no evidence of loss
    route(retention, "a", [1, 2, 3, 4], {})
    route(retention, "a", [1, 2, 3, 4, 5, 6], {"a": 1, "b": 4})  # a kept 1 of 4
    assert retention.kept("a") == pytest.approx(0.25)
    assert retention.kept("b") == 1.0  # b was not the prompt's engine: no sample there
    route(retention, "a", [1, 2, 3, 4, 5, 6, 7], {"a": 6})  # all 6 kept this time
    assert retention.kept("a") == pytest.approx((1 + 6) / (4 + 6))


def test_a_return_whose_engine_left_the_pool_counts_but_samples_nothing() -> None:
    retention = Retention(clock=lambda: 0.0)
    route(retention, "a", [1, 2], {})
    route(retention, "b", [1, 2, 3], {"b": 0})  # a is gone: no match for it
    assert retention.kept("a") == 1.0 and retention.kept("b") == 1.0
    assert retention.returns_per_context() == pytest.approx(1 / (1 + 1))


def test_returns_per_context_counts_turns_per_new_conversation() -> None:
    retention = Retention(clock=lambda: 0.0)
    for session in range(3):
        prompt = [100 * session]
        for turn in range(1, 5):  # a first turn and four more
            route(retention, "a", list(prompt), {})
            prompt.append(100 * session + turn)
    # 3 new contexts, 9 returns, and one pseudo-count of a new one
    assert retention.returns_per_context() == pytest.approx(9 / 4)


def test_the_measurements_fade_over_the_window() -> None:
    now = [0.0]
    retention = Retention(window_s=10.0, clock=lambda: now[0])
    route(retention, "a", [1, 2, 3, 4], {})
    route(retention, "a", [1, 2, 3, 4, 5], {"a": 0})  # lost everything
    assert retention.kept("a") == 0.0
    now[0] = 10.0 * math.log(4 / 0.5)  # the 4 expected blocks have faded below one
    assert retention.kept("a") == 1.0  # too old to go by
    assert retention.returns_per_context() == pytest.approx(0.125 / (0.125 + 1))


def test_remembered_prompts_are_bounded() -> None:
    retention = Retention(clock=lambda: 0.0, max_prompts=2)
    for first in (1, 2, 3):
        route(retention, "a", [first], {})
    assert retention.previous([1, 9]) is None  # the oldest was dropped
    assert retention.previous([3, 9]) is not None


def test_a_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        Retention(window_s=0.0)


def pricing() -> tuple[RoutingCost, Retention, LiveSet, list[Engine]]:
    predictor = TtftPredictor(base_s=0.01, queue_s_per_request=0.02, prefill_s_per_token=1e-4)
    ledger = TtftLedger(predictor, PrefillBacklog(clock=lambda: 0.0))
    live, retention = LiveSet(clock=lambda: 0.0), Retention(clock=lambda: 0.0)
    cost = RoutingCost(ledger, live, KvIndex(), retention)
    engines = [Engine(EngineSpec(f"http://127.0.0.1:{8100 + i}")) for i in range(2)]
    for engine in engines:
        engine.kv_capacity_blocks = 100
    return cost, retention, live, engines


def test_a_context_is_charged_what_its_returns_will_prefill_again_where_the_cache_drops_it() -> (
    None
):
    cost, retention, _, (leaky, keeping) = pricing()
    for session in range(4):  # four conversations of three turns on `leaky`
        first = [100 * session, 100 * session + 1]
        second = [*first, 100 * session + 2]
        route(retention, leaky.name, first, {})
        route(retention, leaky.name, second, {leaky.name: 1})  # kept 1 of 2
        route(retention, leaky.name, [*second, 100 * session + 3], {leaky.name: 3})
    assert retention.kept(leaky.name) == pytest.approx((4 * 1 + 4 * 3) / (4 * 2 + 4 * 3))
    returns = retention.returns_per_context()
    assert returns == pytest.approx(8 / 5)
    price = cost.price(leaky, 1000, CachedPrompt(gpu_tokens=1000))
    assert price.lost_s == pytest.approx(1000 * 1e-4 * (1 - 16 / 20) * returns)
    assert price.total_s == pytest.approx(
        price.ttft_s + price.delay_s + price.evict_s + price.lost_s
    )
    assert cost.price(keeping, 1000, CachedPrompt()).lost_s == 0.0  # no return lost anything


def test_an_engine_with_more_live_blocks_than_it_holds_keeps_at_most_what_fits() -> None:
    """Before any return can show it, a crowd of contexts routed to one engine is priced: it
    keeps at most its capacity's share of them."""
    cost, retention, live, (crowded, _) = pricing()
    route(retention, crowded.name, [1], {})
    route(retention, crowded.name, [1, 2], {crowded.name: 1})  # one return, nothing lost
    live.touch(crowded.name, list(range(400)))  # 400 live blocks routed to a 100-block cache
    assert cost.kept(crowded) == pytest.approx(0.25)
    price = cost.price(crowded, 1000, CachedPrompt())
    assert price.lost_s == pytest.approx(1000 * 1e-4 * 0.75 * retention.returns_per_context())


def test_a_shared_prompt_on_an_engine_that_loses_its_sessions_is_copied_elsewhere() -> None:
    """The holder of a shared system prompt saves a new session most of its prefill, but its
    sessions' returns found only the system prompt: the session starts on an engine that
    keeps it (the matrix's mt-s50-w050-u32, where every cache-aware router used one engine:
    prompts of about 1,400 tokens, 1,000 of them the system prompt, ten turns)."""
    cost, retention, _, (holder, other) = pricing()
    system = list(range(63))
    for session in range(20):  # the holder kept nothing of a session but the system prompt
        own = iter(range(1000 * (session + 1), 1000 * (session + 2)))
        prompt = [*system, *(next(own) for _ in range(6))]
        route(retention, holder.name, prompt, {})
        for _ in range(9):  # each turn adds a question and an answer: 6 blocks
            prompt = [*prompt, *(next(own) for _ in range(6))]
            route(retention, holder.name, prompt, {holder.name: 63})
    prices = [
        cost.price(e, 1400, CachedPrompt(gpu_tokens=1000 if e is holder else 0))
        for e in (holder, other)
    ]
    assert cost.cheapest(prices).engine is other
    fresh = Retention(clock=lambda: 0.0)  # without the returns' evidence it would stay
    cost.retention = fresh
    prices = [
        cost.price(e, 1400, CachedPrompt(gpu_tokens=1000 if e is holder else 0))
        for e in (holder, other)
    ]
    assert cost.cheapest(prices).engine is holder


def test_a_request_routed_twice_is_observed_once_and_placed_where_it_went_last() -> None:
    """Two predicting plugins in one policy, or a retry on another engine, route one request
    twice: it is one new context, not a return of itself."""
    cost, retention, _, (first, second) = pricing()
    state = CycleState()
    cost.routed(first, [1, 2], {}, state)
    cost.routed(second, [1, 2], {}, state)  # retried there
    assert retention.returns_per_context() == 0.0
    placed = retention.previous([1, 2, 3])
    assert placed is not None and placed.engine == second.name
