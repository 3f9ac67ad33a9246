"""Pieces the router benchmarks share: an instant OpenAI-shaped engine, core pinning, processes
and peer routers.

    python -m benchmarks.instant_engine PORT [--chunks N] [--gap-ms MS]

The engine answers `/v1/completions` and `/v1/chat/completions` at once (whole, or a stream of N
chunks, back to back or `--gap-ms` apart as a decoding engine sends its tokens) without parsing
the body: it looks for `"stream": true` in the bytes, so a 100 kB agentic body costs it a read,
not a JSON parse, and what a benchmark measures is the router. It publishes no KV events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from hiveroute import runtime
from hiveroute.runtime import free_port

_STREAM = re.compile(rb'"stream"\s*:\s*true')


def serve_engine(port: int, chunks: int, gap_s: float = 0.0) -> None:
    """Serve the instant engine on 127.0.0.1:port until killed (`gap_s`: the pause between
    a stream's chunks; 0: one chunk per event-loop turn)."""
    from aiohttp import web

    usage = {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}
    whole = json.dumps({
        "id": "cmpl-1", "object": "text_completion", "model": "m",
        "choices": [{"index": 0, "text": "x", "finish_reason": "length"}], "usage": usage,
    }).encode()  # fmt: skip
    whole_chat = json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                     "finish_reason": "length"}], "usage": usage,
    }).encode()  # fmt: skip
    chunk = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"tok "}]}\n\n'
    chat_chunk = (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk",'
        b'"choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n'
    )
    models = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()

    def handler(body_whole: bytes, body_chunk: bytes):  # type: ignore[no-untyped-def]
        async def answer(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            if not _STREAM.search(body):
                return web.Response(body=body_whole, content_type="application/json")
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for _ in range(chunks):
                await response.write(body_chunk)
                await asyncio.sleep(gap_s)  # one chunk per step, as an engine decodes
            await response.write(b"data: [DONE]\n\n")
            return response

        return answer

    async def ok(request: web.Request) -> web.Response:
        return web.Response(body=models, content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/completions", handler(whole, chunk))
    app.router.add_post("/v1/chat/completions", handler(whole_chat, chat_chunk))
    app.router.add_get("/v1/models", ok)
    app.router.add_get("/health", ok)
    app.router.add_get("/metrics", metrics)
    runtime.use_fastest_event_loop()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, backlog=4096)


# --- processes ----------------------------------------------------------------------------


def pin(*cores: int) -> None:
    """Pin the calling process to these cores, where the machine has them."""
    count = os.cpu_count() or 1
    wanted = {c for c in cores if c < count}
    if hasattr(os, "sched_setaffinity") and wanted:
        os.sched_setaffinity(0, wanted)


def start(
    cmd: list[str],
    cores: tuple[int, ...],
    log: Path,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start cmd pinned to cores, its output in log (env: extra environment variables).

    `cwd`: where it runs. `python -m` looks in its working directory before PYTHONPATH, so a
    router from another checkout must run in that checkout (from this one it would import
    this checkout's hiveroute whatever PYTHONPATH says)."""
    out = open(log, "wb")
    return subprocess.Popen(
        cmd,
        stdout=out,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: pin(*cores),
        env={**os.environ, **env} if env else None,
        cwd=cwd,
    )


def start_engine(
    port: int, chunks: int, cores: tuple[int, ...], log: Path, gap_ms: float = 0.0
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "benchmarks.instant_engine", str(port), "--chunks", str(chunks)]
    cmd += ["--gap-ms", repr(gap_ms)]
    return start(cmd, cores, log)


def stop_all(procs: list[subprocess.Popen[bytes]], timeout_s: float = 20.0) -> None:
    """SIGTERM each, wait up to `timeout_s` for each to finish, kill what does not."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status < 500:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{url} did not come up")


# --- peer routers -------------------------------------------------------------------------


async def peer_command(
    name: str, engine_urls: list[str], port: int, policy: str | None, logs: Path
) -> list[str]:
    """A peer router's command line, installed once into its own venv by hiveroute.bench.peers."""
    from hiveroute.bench.peers import PEERS, ensure_peer, peer_argv

    peer = PEERS[name]
    python = await ensure_peer(peer, logs / f"{name}-install.log")
    return peer_argv(peer, python, port, free_port(), engine_urls, policy or peer.default_policy)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("port", type=int)
    parser.add_argument("--chunks", type=int, default=32, help="chunks per streamed response")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="pause between chunks")
    args = parser.parse_args()
    serve_engine(args.port, args.chunks, args.gap_ms / 1000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
