"""What computing block keys costs, at the sizes the router sees them.

The router keys every block an engine reports stored (a KV event carries a few blocks: one per
decode step that fills a block, a prefill's worth after a prompt) and every request's prompt
(thousands of tokens). Two figures per size, in microseconds per call:
- back to back: the same call repeated in a loop (warm caches);
- after a pause: one call after 10 ms asleep, as an event finds a router between requests.

    PYTHONPATH=. python -m benchmarks.block_keys [--repeats 5] [--report NAME]

Run it at two commits to compare implementations (a `git archive` of each).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.report import publish
from hiveroute.kvindex.blocks import block_keys

BLOCK_SIZE = 16
SIZES = {  # label -> blocks
    "1 block (a decode step's event)": 1,
    "20 blocks (a prefill's event)": 20,
    "625 blocks (a 10,000-token prompt)": 625,
}
PAUSE_S = 0.01
PAUSED_CALLS = 100


def back_to_back_us(tokens: list[int], repeats: int) -> float:
    """Median over `repeats` loops of the mean time per call."""
    calls = max(20, 100_000 // len(tokens))
    means = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            block_keys(tokens, BLOCK_SIZE)
        means.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(means)


def after_pause_us(tokens: list[int]) -> float:
    """Median time of one call made after `PAUSE_S` asleep."""
    times = []
    for _ in range(PAUSED_CALLS):
        time.sleep(PAUSE_S)
        started = time.perf_counter()
        block_keys(tokens, BLOCK_SIZE)
        times.append((time.perf_counter() - started) * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--report", default="block_keys", help="report name under results/")
    args = parser.parse_args()
    rng = random.Random(0)
    rows = ["| size | back to back (µs/call) | after a 10 ms pause (µs/call) |", "|---|---:|---:|"]
    figures = {}
    for label, blocks in SIZES.items():
        tokens = [rng.randrange(128_000) for _ in range(blocks * BLOCK_SIZE)]
        warm, paused = back_to_back_us(tokens, args.repeats), after_pause_us(tokens)
        figures[label] = {"back_to_back_us": round(warm, 2), "after_pause_us": round(paused, 2)}
        rows.append(f"| {label} | {warm:.1f} | {paused:.1f} |")
        print(rows[-1], flush=True)
    body = f"Block size {BLOCK_SIZE}; medians of {args.repeats} loops and {PAUSED_CALLS} paused calls.\n\n"
    publish(args.report, "What computing block keys costs", body + "\n".join(rows), figures)


if __name__ == "__main__":
    main()
