"""How much the tokenizer's prefix cache saves on agentic prompts.

Agents of one workflow send ~20k-token prompts that share a ~19k-token context and differ in
the last ~1k.
Without the cache every prompt is tokenized whole; with it only the new part is.

With `--layout role_first` each agent's chat prompt begins with a role prompt of its own, then
the shared context, then its own part: no prefix is shared past the role prompt. The prompts
are tokenized three ways: whole, through a cache that reuses prefixes only (as before
2026-12-06), and through the router's cache, which also reuses content-defined chunks.

With `--layout sibling_worker` two workers of one router (two tokenizers, each with its own
cache) see each workflow: one tokenizes the planner's context-first prompt, the other the
executor's, which shares the context. Each new workflow is tokenized by two such pairs,
alternating which goes first: workers alone, and workers sharing their chunks
(kvindex/shared_chunks.py, as `serve --workers` runs them).

With `--layout new_context` each prompt is a new workflow's first (a context no engine holds,
then the agent's own part): what routing waits for before sending it is its head
(routing/request_tokens.py: the prompt as far as an engine could hold it), against the whole
prompt as before; the whole prompt is tokenized again once the request is on its way.

    PYTHONPATH=. python -m benchmarks.tokenize_prefix [--tokenizer DIR] [--turns 20]
        [--layout context_first|role_first|sibling_worker|new_context]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.report import write_report
from hiveroute.kvindex.shared_chunks import SharedChunkStore
from hiveroute.kvindex.tokenizer import HFTokenizer
from hiveroute.routing.request_tokens import HEAD_CHARS
from hiveroute.runtime import memory_dir

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
    parser.add_argument(
        "--layout",
        choices=("context_first", "role_first", "sibling_worker", "new_context"),
        default="context_first",
    )
    args = parser.parse_args()
    tok = tokenizer(args.tokenizer)
    rng = random.Random(0)

    def words(n_tokens: int) -> str:
        return " ".join(
            rng.choice(WORDS) + rng.choice(("", "s", "ed", ",", "."))
            for _ in range(int(n_tokens / 1.4))
        )

    if args.layout == "role_first":
        lines = role_first(tok, args, words)
    elif args.layout == "new_context":
        lines = new_context(tok, args, words)
    elif args.layout == "sibling_worker":
        with tempfile.TemporaryDirectory(prefix="hr-chunks-", dir=memory_dir()) as shared_dir:
            lines = sibling_worker(tok, args, words, shared_dir)
    else:
        lines = context_first(tok, args, words)
    print("\n".join(lines))
    name = "tokenize_prefix" if args.layout == "context_first" else f"tokenize_prefix_{args.layout}"
    path = write_report(name, "Tokenizer prefix cache", "```\n" + "\n".join(lines) + "\n```")
    print(f"report: {path}")


def context_first(
    tok: HFTokenizer, args: argparse.Namespace, words: Callable[[int], str]
) -> list[str]:
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
    return [
        f"prompts: {len(sizes)}, median {statistics.median(sizes)} tokens, "
        f"~{args.new_tokens} new tokens each",
        f"full encode:     median {full * 1000:.2f} ms",
        f"prefix-cached:   median {cached * 1000:.2f} ms",
        f"speedup:         {full / cached:.1f}x (ids identical on every prompt)",
    ]


def role_first(
    tok: HFTokenizer, args: argparse.Namespace, words: Callable[[int], str]
) -> list[str]:
    prefix_only = HFTokenizer(tok.directory)  # a cache of its own, asked for prefixes only
    context = words(args.prompt_tokens - args.new_tokens)
    roles = ["planner", "executor", "validator", "reviewer"]
    timings: dict[str, list[float]] = {"full": [], "prefix": [], "chunks": []}
    sizes = []
    for turn in range(args.turns):
        role = roles[turn % len(roles)]
        messages = [
            {"role": "system", "content": f"You are agent {turn}, the {role}. " + words(200)},
            {"role": "user", "content": context},
            {"role": "user", "content": words(args.new_tokens)},
        ]
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
        t0 = time.perf_counter()
        expected = tok.encode_uncached(text, add_special_tokens=False)
        t1 = time.perf_counter()
        by_prefix = prefix_only.encode(text, add_special_tokens=False)
        t2 = time.perf_counter()
        by_chunks = tok.encode(text, add_special_tokens=False, chunked=True)
        t3 = time.perf_counter()
        assert by_prefix == expected and by_chunks == expected, "ids differ from a full encode"
        if turn == 0:
            continue  # the first prompt fills both caches
        for key, seconds in zip(timings, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            timings[key].append(seconds)
        sizes.append(len(expected))
    full, prefix, chunks = (statistics.median(timings[k]) for k in timings)
    return [
        f"prompts: {len(sizes)}, median {statistics.median(sizes)} tokens; each agent's own "
        f"role prompt first, then the shared context, then ~{args.new_tokens} tokens of its own",
        f"full encode:            median {full * 1000:.2f} ms",
        f"prefix reuse only:      median {prefix * 1000:.2f} ms ({full / prefix:.1f}x)",
        f"prefix and chunks:      median {chunks * 1000:.2f} ms ({full / chunks:.1f}x)",
        "ids identical to a full encode on every prompt, both ways",
    ]


def sibling_worker(
    tok: HFTokenizer, args: argparse.Namespace, words: Callable[[int], str], shared_dir: str
) -> list[str]:
    pairs = {
        "alone": [HFTokenizer(tok.directory) for _ in range(2)],
        "shared": [
            HFTokenizer(tok.directory, shared_chunks=SharedChunkStore(shared_dir, max_tokens=10**7))
            for _ in range(2)
        ],
    }
    timings: dict[tuple[str, str], list[float]] = {
        (way, agent): [] for way in pairs for agent in ("planner", "executor")
    }
    sizes = []
    for turn in range(args.turns):
        context = words(args.prompt_tokens - args.new_tokens)
        prompts = {
            agent: tok.apply_chat_template(
                [
                    {"role": "system", "content": "The workflow's documents.\n" + context},
                    {"role": "user", "content": f"You are the {agent}. " + words(args.new_tokens)},
                ],
                add_generation_prompt=True,
            )
            for agent in ("planner", "executor")
        }
        expected = tok.encode_uncached(prompts["executor"], add_special_tokens=False)
        for way in sorted(pairs, reverse=turn % 2 == 1):  # alternate which pair goes first
            for worker, agent in zip(pairs[way], ("planner", "executor"), strict=True):
                t0 = time.perf_counter()
                got = worker.encode(prompts[agent], add_special_tokens=False, chunked=True)
                timings[way, agent].append(time.perf_counter() - t0)
            assert got == expected, "ids differ from a full encode"
        sizes.append(len(expected))
    median = {key: statistics.median(values[1:]) * 1000 for key, values in timings.items()}
    return [
        f"workflows: {len(sizes) - 1} (after a first one), median {statistics.median(sizes)}"
        f" tokens a prompt; a new context-first context each, ~{args.new_tokens} tokens of each"
        " agent's own",
        "the planner's prompt on one worker, its executor's on the other:",
        f"workers alone:          planner {median['alone', 'planner']:.2f} ms, "
        f"executor {median['alone', 'executor']:.2f} ms",
        f"workers sharing chunks: planner {median['shared', 'planner']:.2f} ms, "
        f"executor {median['shared', 'executor']:.2f} ms",
        "ids identical to a full encode on every prompt",
    ]


def new_context(
    tok: HFTokenizer, args: argparse.Namespace, words: Callable[[int], str]
) -> list[str]:
    before = HFTokenizer(tok.directory)  # a cache of its own, tokenizing every prompt whole
    timings: dict[str, list[float]] = {"whole": [], "head": [], "rest": []}
    sizes, heads = [], []
    for _ in range(args.turns + 1):
        context = words(args.prompt_tokens - args.new_tokens)
        text = tok.apply_chat_template(
            [
                {"role": "system", "content": "The workflow's documents.\n" + context},
                {"role": "user", "content": "You are the planner. " + words(args.new_tokens)},
            ],
            add_generation_prompt=True,
        )
        t0 = time.perf_counter()
        expected = before.encode(text, add_special_tokens=False, chunked=True)
        t1 = time.perf_counter()
        found = tok.encode_head(text, add_special_tokens=False, beyond=HEAD_CHARS)
        t2 = time.perf_counter()
        got = tok.encode(text, add_special_tokens=False, chunked=True)
        t3 = time.perf_counter()
        assert found is not None, "this tokenizer cannot stop early (no split from the text)"
        assert found[0] == expected[: len(found[0])] and got == expected, "ids differ"
        for key, seconds in zip(timings, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            timings[key].append(seconds)
        sizes.append(len(expected))
        heads.append(len(found[0]))
    whole, head, rest = (statistics.median(timings[k][1:]) * 1000 for k in timings)
    return [
        f"prompts: {len(sizes) - 1} (after a first one), median {statistics.median(sizes)} tokens;"
        " a new context each (no engine holds it), then the agent's own part",
        f"whole prompt before sending (as before):  median {whole:.2f} ms",
        f"its head before sending:                  median {head:.2f} ms"
        f" ({statistics.median(heads)} tokens; {whole / head:.0f}x less)",
        f"the whole, once the request is on its way: median {rest:.2f} ms"
        f" (head and whole: {(head + rest) / whole:.2f} of the whole before)",
        "ids identical to a full encode on every prompt",
    ]


if __name__ == "__main__":
    main()
