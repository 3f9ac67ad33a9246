"""`hiveroute serve` as a user runs it: a real process, real flags, real signals."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import aiohttp

from hiveroute.runtime import free_port
from tests.support.fake_engine import FakeEngine


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hiveroute", *args], capture_output=True, text=True, timeout=60
    )


def test_bad_flags_exit_2_with_a_message() -> None:
    done = run_cli("serve", "--engine", "ftp://nowhere")
    assert done.returncode == 2 and "http://HOST:PORT" in done.stderr
    done = run_cli("serve", "--policy", "telepathy", "--engine", "http://127.0.0.1:9")
    assert done.returncode == 2 and "unknown policy 'telepathy'" in done.stderr
    done = run_cli("serve", "--port", "many")
    assert done.returncode == 2 and "port" in done.stderr


async def test_serve_runs_logs_json_and_stops_on_sigterm() -> None:
    engine = FakeEngine()
    await engine.start()
    port = free_port()
    env = {**os.environ, "HIVEROUTE_POLICY": "least_load"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hiveroute", "serve", "--engine", engine.url, "--host", "127.0.0.1",
        "--port", str(port), "--log-level", "info",
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
            body = {
                "model": "m",
                "prompt": "p",
                "hiveroute": {"workflow_id": "wf-9", "agent_id": "a1"},
            }
            async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
                assert resp.status == 200
                assert resp.headers["X-Hiveroute-Policy"] == "least_load"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=20) == 0
        assert proc.stderr is not None
        lines = [
            json.loads(line)
            for line in (await proc.stderr.read()).decode().splitlines()
            if line.startswith("{")
        ]
        access = [line for line in lines if line.get("event") == "request"]
        assert len(access) == 1
        assert access[0]["workflow_id"] == "wf-9" and access[0]["agent_id"] == "a1"
        assert access[0]["status"] == 200 and access[0]["engine"] == f"127.0.0.1:{engine.port}"
        assert access[0]["duration_ms"] >= 0
        # the router's own part of it: arrival to the upstream send
        assert 0 <= access[0]["overhead_ms"] <= access[0]["duration_ms"]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await engine.stop()
