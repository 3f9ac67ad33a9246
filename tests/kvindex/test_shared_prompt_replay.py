"""Multi-turn chat sessions that all start with one system prompt, replayed through the `kv`
policy and four engines' real prefix caches (the simulator's block pool, whose KV events feed
the router's index). No wall clock: rounds of requests, a clock the test moves."""

from array import array
from typing import Any

from hiveroute.engines.engine import EngineSpec
from hiveroute.engines.pool import EnginePool
from hiveroute.kvindex.events import decode_event
from hiveroute.kvindex.index import KvIndex
from hiveroute.kvindex.tokenizer import BuiltinTokenizer
from hiveroute.metadata import RequestMetadata
from hiveroute.routing.backlog import PrefillBacklog
from hiveroute.routing.base import CycleState, RequestOutcome, RoutingRequest
from hiveroute.routing.costs import CostModel
from hiveroute.routing.live_set import LiveSet
from hiveroute.routing.registry import PluginContext, build_policy
from hiveroute.sim.kv_cache import BlockPool, CacheRequest, KVCacheManager

BLOCK = 16
SYSTEM = " ".join(f"rule{i} of the assistant" for i in range(120))  # ~600 tokens, all share it


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}w{i}" for i in range(n))


class Cache:
    """One engine's prefix cache: serve a prompt, return the tokens it had cached."""

    def __init__(self, blocks: int) -> None:
        self.manager = KVCacheManager(BlockPool(blocks, BLOCK))

    def serve(self, tokens: list[int], answer: int) -> tuple[int, list[Any]]:
        request = CacheRequest(tokens, None)
        hits, hit_tokens = self.manager.get_computed_blocks(request)
        assert self.manager.allocate_slots(request, 0, len(tokens) - hit_tokens, hits)
        request.token_ids.extend(array("q", [7] * answer))
        self.manager.allocate_slots(request, len(tokens), answer)
        self.manager.free(request)
        return hit_tokens, [decode_event(e) for e in self.manager.pool.take_events()]


def replay(sessions: int, turns: int, blocks: int) -> tuple[dict[str, int], float]:
    """Requests per engine and the fleet's hit rate."""
    now = [0.0]
    pool = EnginePool([EngineSpec(f"http://127.0.0.1:{8100 + i}") for i in range(4)])
    tokenizer = BuiltinTokenizer()
    index = KvIndex()
    costs = CostModel(
        backlog=PrefillBacklog(clock=lambda: now[0]), live=LiveSet(clock=lambda: now[0])
    )
    policy = build_policy(
        "kv", PluginContext(pool, tokenizer=tokenizer, kv_index=index, costs=costs)
    )
    caches = {e.name: Cache(blocks) for e in pool.engines}
    counts = {e.name: 0 for e in pool.engines}
    prompt_tokens = cached_tokens = 0
    history = {s: f"{SYSTEM}\nuser {s}: {words(f'u{s}', 250)}" for s in range(sessions)}
    done = dict.fromkeys(range(sessions), 0)
    round_ = 0
    while any(t < turns for t in done.values()):
        # two sessions start each round; every started session asks its next question
        active = [s for s in range(min(sessions, 2 * (round_ + 1))) if done[s] < turns]
        routed: list[tuple[RoutingRequest, CycleState, str]] = []
        for s in active:
            history[s] += f"\nq{done[s]}: {words(f's{s}t{done[s]}', 20)}"
            body = {"model": "m", "prompt": history[s], "stream": True}
            request = RoutingRequest(f"{s}-{done[s]}", "/v1/completions", body, RequestMetadata())
            state = CycleState()
            await_prepare(policy, request, state)
            decision = policy.choose(request, pool.candidates("m"), state)
            policy.on_routed(request, decision.engine, state)
            policy.on_first_token(request, decision.engine, state)  # then it decodes a while
            decision.engine.load.in_flight += 1
            routed.append((request, state, decision.engine.name))
        for request, state, name in routed:
            engine = pool.get(name)
            assert engine is not None
            tokens = tokenizer.encode(request.body["prompt"])
            hit, events = caches[name].serve(tokens, answer=40)
            for event in events:
                index.apply(name, event)
            uncached = len(tokens) - hit
            outcome = RequestOutcome(
                engine,
                200,
                ttft_s=0.01 + 1e-4 * uncached,
                prompt_tokens=len(tokens),
                cached_tokens=hit,
                completion_tokens=40,
            )
            policy.on_completed(request, outcome, state)
            engine.load.in_flight -= 1
            counts[name] += 1
            prompt_tokens += len(tokens)
            cached_tokens += hit
            s = int(request.request_id.split("-")[0])
            history[s] += f"\na{done[s]}: {words(f'a{s}t{done[s]}', 20)}"
            done[s] += 1
        round_ += 1
        now[0] += 5.0  # think time
    return counts, cached_tokens / prompt_tokens


def await_prepare(policy: Any, request: RoutingRequest, state: CycleState) -> None:
    """`prepare` only tokenizes for `kv`: run the coroutine to its end without an event loop."""
    coroutine = policy.prepare(request, state)
    try:
        coroutine.send(None)
    except StopIteration:
        return
    raise AssertionError("kv's prepare awaited something")


def test_a_shared_system_prompt_keeps_every_engine_in_use() -> None:
    """Every session starts with the same system prompt. It is cached first on whichever
    engine took the first session; new sessions must still spread over all four engines (at
    least half the fair share each), not avoid the engines that lack the prompt."""
    counts, hit_rate = replay(sessions=24, turns=6, blocks=600)
    total = sum(counts.values())
    assert total == 24 * 6
    assert min(counts.values()) >= 0.5 * total / 4, counts
    assert hit_rate > 0.7  # follow-ups still find their history
