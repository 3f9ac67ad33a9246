"""Load: thousands of concurrent streams through the router for a minute, none lost or garbled.

    python benchmarks/load_streams.py [--streams 2000] [--seconds 60] [--engines 4]

Simulated engines (one process) and the router (another) on loopback; this process keeps
`--streams` streamed requests in flight until `--seconds` have passed, checks each finished
stream (HTTP 200, every token's text in order equal to the engine's non-streamed answer for the
same request, the usage chunk, `[DONE]`), and samples the router's resident memory each second.
Writes benchmarks/results/load_streams.{md,json}. Bounded in count and time; loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from hiveroute import runtime
from hiveroute.runtime import free_port

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


async def wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{url} did not come up")


def stream_text(raw: bytes) -> tuple[str, bool, int | None]:
    """The streamed text in order, whether [DONE] came last, and usage.completion_tokens."""
    texts: list[str] = []
    done = False
    completion_tokens = None
    for event in raw.split(b"\n\n"):
        event = event.strip()
        if not event:
            continue
        payload = event.removeprefix(b"data: ")
        if payload == b"[DONE]":
            done = True
            continue
        chunk = json.loads(payload)
        if chunk.get("usage"):
            completion_tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices", []):
            texts.append(choice.get("text", ""))
    return "".join(texts), done, completion_tokens


async def run(args: argparse.Namespace) -> dict[str, object]:
    engine_port, events_port, router_port = free_port(), free_port(), free_port()
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    sim = subprocess.Popen(
        [sys.executable, "-m", "hiveroute", "sim", "--engines", str(args.engines),
         "--base-port", str(engine_port), "--events-base-port", str(events_port),
         "--preset", "fast", "--max-num-seqs", "1024", "--log-level", "warning"],
        stdout=open(logs / "sim.log", "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    engines = [f"http://127.0.0.1:{engine_port + i}" for i in range(args.engines)]
    router = None
    try:
        for url in engines:
            await wait_http(f"{url}/health")
        cmd = [sys.executable, "-m", "hiveroute", "serve", "--host", "127.0.0.1", "--port", str(router_port),
               "--policy", "least_load", "--log-level", "warning", "--max-in-flight", str(args.streams * 2), "--workers", "1"]  # fmt: skip
        for url in engines:
            cmd += ["--engine", url]
        router = subprocess.Popen(
            cmd, stdout=open(logs / "router.log", "wb"), stderr=subprocess.STDOUT
        )
        base = f"http://127.0.0.1:{router_port}"
        await wait_http(f"{base}/health")
        return await drive(args, base, router.pid)
    finally:
        for proc in (router, sim):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)


async def drive(args: argparse.Namespace, base: str, router_pid: int) -> dict[str, object]:
    request = {"model": "sim-fast", "prompt": "the agent plans the task", "max_tokens": args.tokens,
               "ignore_eos": True}  # fmt: skip
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        models = await (await http.get(f"{base}/v1/models")).json()
        request["model"] = models["data"][0]["id"]
        async with http.post(f"{base}/v1/completions", json=request) as resp:
            expected = (await resp.json())["choices"][0]["text"]
        outcomes: Counter[str] = Counter()
        memory: list[tuple[float, float]] = []
        started = time.monotonic()
        deadline = started + args.seconds
        in_flight = 0
        peak_in_flight = 0

        async def client() -> None:
            nonlocal in_flight, peak_in_flight
            while time.monotonic() < deadline:
                in_flight += 1
                peak_in_flight = max(peak_in_flight, in_flight)
                try:
                    async with http.post(
                        f"{base}/v1/completions",
                        json={**request, "stream": True, "stream_options": {"include_usage": True}},
                    ) as resp:
                        raw = await resp.read()
                        if resp.status != 200:
                            outcomes[f"status_{resp.status}"] += 1
                            continue
                    text, done, tokens = stream_text(raw)
                    if text == expected and done and tokens == args.tokens:
                        outcomes["complete"] += 1
                    else:
                        outcomes["corrupted"] += 1
                except (aiohttp.ClientError, TimeoutError) as exc:
                    outcomes[f"error_{type(exc).__name__}"] += 1
                finally:
                    in_flight -= 1

        async def sampler() -> None:
            while time.monotonic() < deadline + 5:
                memory.append((time.monotonic() - started, rss_mib(router_pid)))
                await asyncio.sleep(1.0)

        sampling = asyncio.create_task(sampler())
        await asyncio.gather(*(client() for _ in range(args.streams)))
        elapsed = time.monotonic() - started
        await asyncio.sleep(3)  # let the router settle, then one more memory sample
        memory.append((time.monotonic() - started, rss_mib(router_pid)))
        sampling.cancel()
        health = await (await http.get(f"{base}/health")).json()
    mem = [m for _, m in memory]
    return {
        "streams": args.streams, "seconds": args.seconds, "elapsed_s": round(elapsed, 1),
        "engines": args.engines, "tokens_per_stream": args.tokens, "peak_in_flight": peak_in_flight,
        "outcomes": dict(outcomes), "requests": sum(outcomes.values()),
        "router_rss_mib": {"first": mem[0], "max": max(mem), "last": mem[-1]},
        "router_in_flight_after": sum(e["in_flight"] for e in health["engines"]),
        "memory_samples": memory,
    }  # fmt: skip


def report(args: argparse.Namespace, result: dict[str, object]) -> None:
    outcomes: dict[str, int] = result["outcomes"]  # type: ignore[assignment]
    rss: dict[str, float] = result["router_rss_mib"]  # type: ignore[assignment]
    lost = sum(v for k, v in outcomes.items() if k != "complete")
    lines = [
        "# Load: concurrent streams through the router",
        "",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}",
        f"- command: `{' '.join(shlex.quote(a) for a in sys.argv)}`",
        f"- {result['engines']} simulated engines (preset fast, one process), router policy least_load, all on loopback",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| concurrent streams held | {result['peak_in_flight']} |",
        f"| duration | {result['elapsed_s']} s |",
        f"| streams finished | {result['requests']} |",
        f"| complete and in order | {outcomes.get('complete', 0)} |",
        f"| lost, failed or corrupted | {lost} ({', '.join(f'{k}: {v}' for k, v in outcomes.items() if k != 'complete') or 'none'}) |",
        f"| router RSS first / max / after | {rss['first']:.0f} / {rss['max']:.0f} / {rss['last']:.0f} MiB |",
        f"| router in-flight count after the run | {result['router_in_flight_after']} |",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "load_streams.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "load_streams.json").write_text(json.dumps({"argv": sys.argv, **result}, indent=1))
    print("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per stream")
    parser.add_argument("--log-dir", default="/tmp/hiveroute-load")
    args = parser.parse_args()
    if not (1 <= args.streams <= 10_000 and 1 <= args.seconds <= 600):
        parser.error("--streams must be 1..10000 and --seconds 1..600")
    runtime.use_fastest_event_loop()
    result = asyncio.run(run(args))
    report(args, result)
    outcomes: dict[str, int] = result["outcomes"]  # type: ignore[assignment]
    return 0 if set(outcomes) == {"complete"} else 1


if __name__ == "__main__":
    raise SystemExit(main())
