"""What a request's workflow bookkeeping costs in state-store calls, in process and shared.

    python -m benchmarks.shared_state_calls [--requests 3000] [--concurrency 32] [--reps 3]
    python -m benchmarks.shared_state_calls --base DIR --new DIR [--reps 7] [--name NAME]

Runs the workflow registry's per-request bookkeeping (`record_start`, then `finish_request`,
for 8 workflows × 4 agents) against the in-process MemoryStateStore and against the store that
`serve --workers` shares: a StateServer and a SharedStateClient on a Unix socket, both in this
process, so the CPU time counts both sides of every call. Prints CPU µs per request (medians of
`--reps`). To measure another checkout, run this file as a script with that checkout first on
the path (it imports only hiveroute): `PYTHONPATH=DIR python benchmarks/shared_state_calls.py`.

With `--base` and `--new` (each a `git archive` of a commit), it does that for both, by turns
(base, new, then new, base, ...), one repetition per turn, and writes benchmarks/results/NAME.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hiveroute import runtime
from hiveroute.state.memory import MemoryStateStore
from hiveroute.state.shared import SharedStateClient, StateServer
from hiveroute.state.store import StateStore
from hiveroute.workflows.registry import WorkflowRegistry

WORKFLOWS, AGENTS = 8, 4


async def bookkeeping(store: StateStore, requests: int, concurrency: int) -> float:
    """CPU µs per request of `requests` requests' start and finish, `concurrency` at a time."""
    registry = WorkflowRegistry(store)
    views = [await registry.ensure(f"wf-{w}") for w in range(WORKFLOWS)]

    async def one(i: int) -> None:
        view = views[i % WORKFLOWS]
        agent = f"agent-{i % AGENTS}"
        record = registry.new_record(
            view, request_id=f"r{i}", agent_id=agent, agent_role="worker", stage=None,
            parent_request_id=None,
        )  # fmt: skip
        await registry.record_start(view, record)
        await registry.finish_request(
            view.id, record, engine="e0", status="ok", ttft_s=0.02, duration_s=0.1,
            prompt_tokens=4000, cached_tokens=3500, cross_agent_cached_tokens=3000,
            completion_tokens=20,
        )  # fmt: skip

    async def client(k: int) -> None:
        for i in range(k, requests, concurrency):
            await one(i)

    started = time.process_time()
    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return (time.process_time() - started) * 1e6 / requests


async def main_async(args: argparse.Namespace) -> None:
    results: dict[str, list[float]] = {"memory (one process)": [], "shared (serve --workers)": []}
    directory = tempfile.mkdtemp(prefix="hiveroute-bench-")
    server = StateServer(os.path.join(directory, "state.sock"))
    await server.start()
    try:
        for _ in range(args.reps):
            results["memory (one process)"].append(
                await bookkeeping(MemoryStateStore(), args.requests, args.concurrency)
            )
            shared = SharedStateClient(server.path)
            try:
                results["shared (serve --workers)"].append(
                    await bookkeeping(shared, args.requests, args.concurrency)
                )
            finally:
                await shared.close()
    finally:
        await server.stop()
    if args.json:
        print(json.dumps(results))
        return
    for name, values in results.items():
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"{name:26s} {statistics.median(values):6.0f} CPU µs/request  (reps {shown})")


def by_turns(args: argparse.Namespace) -> None:
    """Both checkouts, one repetition a turn, alternating which goes first; then the report."""
    from benchmarks.report import publish

    sources = {"base": str(Path(args.base).resolve()), "new": str(Path(args.new).resolve())}
    runs: dict[str, dict[str, list[float]]] = {label: {} for label in sources}
    for rep in range(args.reps):
        order = ["base", "new"] if rep % 2 == 0 else ["new", "base"]
        for label in order:
            command = [sys.executable, __file__, "--json", "--reps", "1",
                       "--requests", str(args.requests), "--concurrency", str(args.concurrency)]  # fmt: skip
            out = subprocess.run(
                command, env={**os.environ, "PYTHONPATH": sources[label]},
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            for kind, values in json.loads(out.strip().splitlines()[-1]).items():
                runs[label].setdefault(kind, []).extend(values)
            print(rep, label, {k: round(v[-1]) for k, v in runs[label].items()}, flush=True)
    kinds = list(runs["base"])
    lines = [
        f"- base: {sources['base']}; new: {sources['new']}",
        f"- {args.requests} requests' bookkeeping, {args.concurrency} at a time, "
        f"{args.reps} repetitions of each checkout, by turns",
        "",
        "| store | base CPU µs/request (median) | new (median) | new / base |",
        "|---|---:|---:|---:|",
    ]
    for kind in kinds:
        base, new = statistics.median(runs["base"][kind]), statistics.median(runs["new"][kind])
        lines.append(f"| {kind} | {base:.0f} | {new:.0f} | ×{new / base:.2f} |")
    lines += ["", "Each repetition (µs/request):", ""]
    for label in sources:
        for kind in kinds:
            shown = ", ".join(f"{v:.0f}" for v in runs[label][kind])
            lines.append(f"- {label}, {kind}: {shown}")
    publish(
        args.name,
        "What a request's workflow bookkeeping costs in state calls",
        "\n".join(lines),
        runs,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    parser.add_argument("--base", help="a checkout to compare with --new, by turns")
    parser.add_argument("--new", help="the other checkout")
    parser.add_argument("--name", default="shared_state_calls", help="report name")
    args = parser.parse_args()
    if args.base or args.new:
        if not (args.base and args.new):
            parser.error("--base and --new go together")
        by_turns(args)
        return
    runtime.run(main_async(args))


if __name__ == "__main__":
    main()
