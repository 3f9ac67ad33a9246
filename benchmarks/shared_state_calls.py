"""What a request's workflow bookkeeping costs in state-store calls, in process and shared.

    python -m benchmarks.shared_state_calls [--requests 3000] [--concurrency 32] [--reps 3]

Runs the workflow registry's per-request bookkeeping (`record_start`, then `finish_request`,
for 8 workflows × 4 agents) against the in-process MemoryStateStore and against the store that
`serve --workers` shares: a StateServer and a SharedStateClient on a Unix socket, both in this
process, so the CPU time counts both sides of every call. Prints CPU µs per request (medians of
`--reps`). To measure another checkout, run this file as a script with that checkout first on
the path (it imports only hiveroute): `PYTHONPATH=DIR python benchmarks/shared_state_calls.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

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
    for name, values in results.items():
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"{name:26s} {statistics.median(values):6.0f} CPU µs/request  (reps {shown})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    runtime.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
