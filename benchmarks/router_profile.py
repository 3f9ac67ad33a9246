"""Where the router's CPU goes on agentic bodies: py-spy samples of a loaded router, summarised.

    python -m benchmarks.router_profile [--policy workflow] [--words 4000] [--seconds 15]

Starts two instant engines (benchmarks.instant_engine) and one router pinned to core 1, sends
4,000-word agentic chat bodies from 32 closed-loop clients, and records the router with
`py-spy record --format raw` (pip install py-spy). Prints the functions with the most samples,
self (the frame on top of the stack) and inclusive (anywhere in it), as percentages of the
router's samples, plus the CPU ms per request over the run. The raw stacks stay in --out.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from benchmarks.agentic_bodies import agentic_bodies
from benchmarks.instant_engine import pin, start, start_engine, stop_all, wait_http
from benchmarks.router_cpu import Running, closed_loop
from hiveroute import runtime
from hiveroute.runtime import free_port

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:]*):\d+\)$")


def frame_name(frame: str) -> str:
    """`func (path/to/module.py:12)` -> `module.py:func` (lines merged)."""
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip()
    file = m.group("file")
    parts = Path(file).parts
    ours = "hiveroute" in parts
    file = "/".join(parts[parts.index("hiveroute") :]) if ours else Path(file).name
    return f"{file}:{m.group('func')}"


def summarise(raw: Path, top: int) -> str:
    self_counts: Counter[str] = Counter()
    incl_counts: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame_name(f) for f in stack.split(";") if f and not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames:
            continue
        total += count
        self_counts[frames[-1]] += count
        for name in set(frames):
            incl_counts[name] += count
    lines = [f"{total} samples", "", "| self % | function |", "|---:|---|"]
    lines += [f"| {100 * c / total:.1f} | `{n}` |" for n, c in self_counts.most_common(top)]
    lines += ["", "| inclusive % | function (hiveroute's own) |", "|---:|---|"]
    ours = [(n, c) for n, c in incl_counts.most_common() if n.startswith("hiveroute/")]
    lines += [f"| {100 * c / total:.1f} | `{n}` |" for n, c in ours[:top]]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    pin(0)
    logs = Path(args.out)
    logs.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    ports = [free_port(), free_port()]
    procs = [start_engine(p, 32, (0,), logs / f"engine-{p}.log") for p in ports]
    engines = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url in engines:
            await wait_http(f"{url}/health")
        port = free_port()
        router_cmd = [sys.executable, "-m", "hiveroute", "serve", "--host", "127.0.0.1", "--port", str(port),
                      "--policy", args.policy, "--log-level", "warning", "--health-interval-s", "5",
                      "--keep-warm-interval-s", "0", "--workers", "1"]  # fmt: skip
        for url in engines:
            router_cmd += ["--engine", url]
        router = start(router_cmd, (1,), logs / "router.log")
        procs.append(router)
        url = f"http://127.0.0.1:{port}"
        await wait_http(f"{url}/health")
        bodies = agentic_bodies(args.words, 256)
        running = Running([url], [router])
        await closed_loop([url], bodies, 32, 2.0, running)  # warm-up
        raw = logs / f"{args.policy}-{args.words}.raw"
        spy = subprocess.Popen(
            [py_spy, "record", "--format", "raw", "--rate", "250", "--pid", str(router.pid),
             "--duration", str(int(args.seconds)), "--output", str(raw), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        result = await closed_loop([url], bodies, 32, args.seconds, running)
        await asyncio.to_thread(spy.wait)
    finally:
        stop_all(procs)
    print(
        f"# {args.policy}, {args.words}-word bodies: {result['cpu_ms_per_req']:.2f} CPU ms/req, "
        f"{result['req_per_s']:.0f} req/s (under py-spy)\n"
    )
    print(summarise(raw, args.top))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policy", default="workflow")
    parser.add_argument("--words", type=int, default=4000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default="/tmp/hiveroute-router-profile")
    args = parser.parse_args()
    runtime.use_fastest_event_loop()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
