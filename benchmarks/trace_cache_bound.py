"""How much prefix-cache hit rate placement alone can buy on the Mooncake trace.

Replays the trace, one request at a time with no timing and no load, through the simulator's own
KV caches (`hiveroute.sim.kv_cache`: vLLM's block pool, LRU free queue, tail-first freeing, last
token recomputed) and a few placement rules:

- `one cache`: one engine with the N engines' blocks together (the kv_routing benchmark's ideal);
- `unbounded`: one cache that never evicts (every miss left is a first sight);
- `kv rule`: the `kv` policy's placement until 2026-12-02 (a footprint rule since replaced by
  the cost in hiveroute/routing/cost.py), without its TTFT terms: the engine holding the longest
  prefix; a prompt no engine holds half of is a new context and goes where the fewest tokens were
  written lately (10 s half-life) among engines within `--same-share` of the prompt of the best
  match;
- `kv rule, uneven`: the same, but the engines take new contexts in unequal shares
  (`--uneven`), as a router that places them by the load of the moment ends up doing;
- `kv rule, jittered`: the same rule with each engine's recent writes blurred by up to
  `--jitter` (`--seeds` runs, lowest to highest): how far chance alone moves one slice's hit rate;
- `kv rule, shielded` (with `--shield ALPHA`): new contexts also kept away from engines whose
  cache is serving hits lately (their recent writes plus ALPHA x their recently hit tokens, same
  half-life), so that conversations which came back once, and may again, are evicted later.

The gap between `one cache` and `unbounded` is what capacity costs; the gap between `kv rule`
and `one cache` is all that placement could still win. Run it on several slices of the trace:

    PYTHONPATH=. python -m benchmarks.trace_cache_bound --slices 8
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean

from benchmarks.cli import comma_floats
from benchmarks.report import write_report
from hiveroute.bench.workloads.trace import TraceConfig, TraceWorkload, full_trace_path
from hiveroute.kvindex.tokenizer import BuiltinTokenizer
from hiveroute.sim.kv_cache import BlockPool, CacheRequest, KVCacheManager

HALF_LIFE_S = 10.0  # the old kv policy's footprint half-life
NEW_CONTEXT_SHARE = 0.5  # the old kv policy's: under half the prompt cached anywhere = new context


@dataclass
class Engine:
    """One simulated engine's cache and how many tokens were written to it lately."""

    cache: KVCacheManager
    written: float = 0.0
    as_of: float = 0.0
    weight: float = 1.0  # its share of new contexts, relative to the others

    def cached(self, request: CacheRequest) -> int:
        return self.cache.get_computed_blocks(request)[1]

    def recent_writes(self, now: float) -> float:
        return self.written * math.exp2(-(now - self.as_of) / HALF_LIFE_S)

    def serve(self, request: CacheRequest, output_tokens: int, now: float) -> int:
        """Prefill, write the output, free (tail first); the prompt tokens that were cached."""
        hits, hit_tokens = self.cache.get_computed_blocks(request)
        prompt = len(request.token_ids)
        if not self.cache.allocate_slots(request, 0, prompt - hit_tokens, hits):
            raise SystemExit("a prompt is larger than an engine's cache: use more --blocks")
        request.token_ids.extend(array("q", [7] * output_tokens))  # the reply is cached too
        self.cache.allocate_slots(request, prompt, output_tokens)
        self.cache.free(request)
        self.written = self.recent_writes(now) + prompt - hit_tokens
        self.as_of = now
        return hit_tokens


Rule = Callable[[list[Engine], CacheRequest, float], Engine]


def kv_rule(same_share: float, jitter: float = 0.0, seed: int = 0, shield: float = 0.0) -> Rule:
    """The kv placement; `jitter` blurs each engine's recent writes by up to that share, as
    the timing of a live run does (a reply a few ms later changes what "lately" holds).
    `shield` > 0 makes a new context also count each engine's recently hit tokens that many
    times beside its recent writes (the shielded rule)."""
    rng = random.Random(seed)
    hits: dict[int, tuple[float, float]] = {}  # id(engine) -> (hit tokens, as of)

    def recent_hits(engine: Engine, now: float) -> float:
        tokens, at = hits.get(id(engine), (0.0, now))
        return tokens * math.exp2(-(now - at) / HALF_LIFE_S)

    def place(engines: list[Engine], request: CacheRequest, now: float) -> Engine:
        n = len(request.token_ids)
        cached = [e.cached(request) for e in engines]
        best = max(cached)
        new_context = best < NEW_CONTEXT_SHARE * n
        floor = best - same_share * n if new_context else best
        eligible = [e for e, c in zip(engines, cached, strict=True) if c >= floor]
        weight_of_hits = shield if new_context else 0.0

        def lately(e: Engine) -> float:
            writes = e.recent_writes(now) / e.weight * (1 + jitter * rng.uniform(-1, 1))
            return writes + weight_of_hits * recent_hits(e, now)

        chosen = min(eligible, key=lately)
        if not new_context:
            hits[id(chosen)] = (recent_hits(chosen, now) + best, now)
        return chosen

    return place


@dataclass
class Outcome:
    hit_tokens: int = 0
    prompt_tokens: int = 0
    written: list[int] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def replay(
    workload: TraceWorkload,
    prompts: Sequence[list[int]],
    engines: list[Engine],
    place: Rule,
    block_size: int,
) -> Outcome:
    outcome = Outcome()
    start = workload.rows[0].timestamp_ms
    written = {id(e): 0 for e in engines}
    for row, tokens in zip(workload.rows, prompts, strict=True):
        now = (row.timestamp_ms - start) / 1000.0 / workload.config.speed
        request = CacheRequest(tokens, None)
        engine = place(engines, request, now)
        hit = engine.serve(request, workload.max_tokens(row), now)
        outcome.hit_tokens += hit
        outcome.prompt_tokens += len(tokens)
        written[id(engine)] += len(tokens) - hit
    outcome.written = [written[id(e)] for e in engines]
    return outcome


def fleet(n: int, blocks: int, block_size: int, weights: Sequence[float] = ()) -> list[Engine]:
    return [
        Engine(
            KVCacheManager(BlockPool(blocks, block_size, enable_events=False)),
            weight=weights[i] if weights else 1.0,
        )
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=None)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=12000, help="KV blocks per engine")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--requests", type=int, default=1500, help="requests per slice")
    parser.add_argument("--slices", type=int, default=1, help="consecutive slices of the trace")
    parser.add_argument("--trace-speed", type=float, default=10.0)
    parser.add_argument("--token-scale", type=float, default=0.1)
    parser.add_argument("--max-output", type=int, default=32)
    parser.add_argument("--same-share", type=float, default=0.1)
    parser.add_argument(
        "--uneven",
        type=comma_floats,
        default="0.8,0.93,1.07,1.2",
        help="new-context shares for the uneven rule",
    )
    parser.add_argument("--jitter", type=float, default=0.05)
    parser.add_argument("--seeds", type=int, default=5, help="runs of the jittered rule")
    parser.add_argument(
        "--shield",
        type=float,
        default=None,
        metavar="ALPHA",
        help="add the shielded rule: new contexts weigh recently hit tokens ALPHA x",
    )
    parser.add_argument("--no-write", dest="write", action="store_false", help="only print")
    args = parser.parse_args()
    uneven = args.uneven
    if len(uneven) != args.engines:
        parser.error(f"--uneven needs {args.engines} shares")

    tokenizer = BuiltinTokenizer()
    n, blocks, bs = args.engines, args.blocks, args.block_size
    kv = kv_rule(args.same_share)
    targets: dict[str, Callable[[], tuple[list[Engine], Rule]]] = {
        "one cache": lambda: (fleet(1, n * blocks, bs), lambda es, r, t: es[0]),
        "unbounded": lambda: (fleet(1, 10**7, bs), lambda es, r, t: es[0]),
        "kv rule": lambda: (fleet(n, blocks, bs), kv),
        "kv rule, uneven": lambda: (fleet(n, blocks, bs, uneven), kv),
    }
    if args.shield is not None:
        if args.shield < 0:
            parser.error("--shield must not be negative")
        alpha = args.shield
        targets["kv rule, shielded"] = lambda: (  # a new rule each run: it keeps the hits
            fleet(n, blocks, bs),
            kv_rule(args.same_share, shield=alpha),
        )
    jittered = "kv rule, jittered"
    rates: dict[str, list[float]] = {name: [] for name in [*targets, jittered]}
    lines = [
        f"{n} engines x {blocks} blocks of {bs} tokens; {args.requests} requests per slice, "
        f"token scale {args.token_scale}, speed {args.trace_speed}x, same-share {args.same_share}, "
        f"jitter {args.jitter} ({args.seeds} seeds)"
        + ("" if args.shield is None else f", shield {args.shield}"),
        "",
        "| slice (rows) | " + " | ".join(rates) + " | kv rule writes per engine (k tokens) |",
        "| --- | " + " | ".join("---:" for _ in rates) + " | --- |",
    ]
    for k in range(args.slices):
        config = TraceConfig(
            path=args.trace or full_trace_path(),
            limit=args.requests,
            skip=k * args.requests,
            speed=args.trace_speed,
            token_scale=args.token_scale,
            max_output_tokens=args.max_output,
        )
        workload = TraceWorkload(config)
        prompts = [tokenizer.encode(workload.prompt(row)) for row in workload.rows]
        cells, writes = [], ""
        for name, build in targets.items():
            engines, place = build()
            outcome = replay(workload, prompts, engines, place, bs)
            rates[name].append(outcome.hit_rate)
            cells.append(f"{100 * outcome.hit_rate:.2f} %")
            if name == "kv rule":
                writes = " / ".join(str(w // 1000) for w in outcome.written)
        seeded = [
            replay(
                workload,
                prompts,
                fleet(n, blocks, bs),
                kv_rule(args.same_share, args.jitter, seed),
                bs,
            ).hit_rate
            for seed in range(args.seeds)
        ]
        rates[jittered].append(mean(seeded))
        cells.append(f"{100 * min(seeded):.2f}-{100 * max(seeded):.2f} %")
        first = k * args.requests
        lines.append(
            f"| {first}-{first + len(workload.rows) - 1} | {' | '.join(cells)} | {writes} |"
        )
        print(lines[-1], flush=True)
    means = " | ".join(f"{100 * mean(r):.2f} %" for r in rates.values())
    lines.append(f"| mean | {means} | |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        path = write_report("trace_cache_bound", "Hit rate placement can buy on the trace", table)
        print(f"report: {path}")


if __name__ == "__main__":
    sys.exit(main())
