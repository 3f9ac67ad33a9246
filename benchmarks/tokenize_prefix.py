"""How much the tokenizer's prefix cache saves on agentic prompts.

Agents of one workflow send ~20k-token prompts that share a ~19k-token context and differ in
the last ~1k.
Without the cache every prompt is tokenized whole; with it only the new part is.

    PYTHONPATH=. python -m benchmarks.tokenize_prefix [--tokenizer DIR] [--turns 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.report import write_report
from hiveroute.kvindex.tokenizer import HFTokenizer

WORDS = (
    "the agent plan task tool result context model cache router engine token block prefix "
    "workflow step review execute answer question search file code test report summary data"
).split()


def tokenizer(directory: str | None) -> HFTokenizer:
    if directory:
        return HFTokenizer(directory)
    from hiveroute.engines.vllm_local import _train_tokenizer

    tmp = Path(tempfile.mkdtemp(prefix="hr-tok-"))
    _train_tokenizer(tmp, 2000)
    return HFTokenizer(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", help="model directory with tokenizer.json")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--prompt-tokens", type=int, default=20_000)
    parser.add_argument("--new-tokens", type=int, default=1_000)
    args = parser.parse_args()
    tok = tokenizer(args.tokenizer)
    rng = random.Random(0)

    def words(n_tokens: int) -> str:
        return " ".join(
            rng.choice(WORDS) + rng.choice(("", "s", "ed", ",", "."))
            for _ in range(int(n_tokens / 1.4))
        )

    base = words(args.prompt_tokens - args.new_tokens)
    # each prompt: the shared ~19k-token context plus its own ~1k-token part (sibling agents)
    prompts = [base + " " + words(args.new_tokens) for _ in range(args.turns)]
    full_s, cached_s, sizes = [], [], []
    tok.encode(prompts[0])  # warm the cache with the first prompt
    for prompt in prompts[1:]:
        t0 = time.perf_counter()
        expected = tok.encode_uncached(prompt)
        t1 = time.perf_counter()
        got = tok.encode(prompt)
        t2 = time.perf_counter()
        assert got == expected, "prefix-cached ids differ from a full encode"
        full_s.append(t1 - t0)
        cached_s.append(t2 - t1)
        sizes.append(len(expected))
    full, cached = statistics.median(full_s), statistics.median(cached_s)
    lines = [
        f"prompts: {len(sizes)}, median {statistics.median(sizes)} tokens, "
        f"~{args.new_tokens} new tokens each",
        f"full encode:     median {full * 1000:.2f} ms",
        f"prefix-cached:   median {cached * 1000:.2f} ms",
        f"speedup:         {full / cached:.1f}x (ids identical on every prompt)",
    ]
    print("\n".join(lines))
    path = write_report(
        "tokenize_prefix", "Tokenizer prefix cache", "```\n" + "\n".join(lines) + "\n```"
    )
    print(f"report: {path}")


if __name__ == "__main__":
    main()
