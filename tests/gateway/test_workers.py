"""`hiveroute serve --workers N`: N processes on one port behave as one router."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest

from hiveroute.runtime import free_port
from tests.support.access import metric_sum
from tests.support.fake_engine import FakeEngine

WORKER_HEADER = "X-Hiveroute-Worker"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hiveroute", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize("value", ["0", "-1", "9"])
def test_bad_worker_counts_are_refused_with_a_clear_message(value: str) -> None:
    done = run_cli("serve", "--engine", "http://127.0.0.1:9", "--workers", value)
    assert done.returncode != 0
    assert f"workers must be 1..8 (router processes on this host), got {value}" in (
        done.stdout + done.stderr
    )


def test_the_workers_env_variable_is_checked_as_the_flag() -> None:
    done = run_cli(
        "serve", "--engine", "http://127.0.0.1:9", env={**os.environ, "HIVEROUTE_WORKERS": "0"}
    )
    assert done.returncode != 0 and "workers must be 1..8" in done.stdout + done.stderr


@pytest.fixture
async def two_workers() -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    engine = FakeEngine()
    await engine.start()
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hiveroute", "serve", "--engine", engine.url, "--host", "127.0.0.1",
        "--port", str(port), "--workers", "2", "--log-level", "warning",
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(600):
                try:
                    async with http.get(f"{url}/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
        yield url, proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await engine.stop()


async def _post(url: str, workflow_id: str, agent: str) -> tuple[str, int]:
    """One request on a new connection (the kernel picks a worker per connection)."""
    body = {
        "model": "m",
        "prompt": "p",
        "hiveroute": {"workflow_id": workflow_id, "agent_id": agent},
    }
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.post(f"{url}/v1/completions", json=body) as resp,
    ):
        await resp.read()
        return resp.headers[WORKER_HEADER], resp.status


async def test_two_workers_serve_one_port_share_workflows_and_metrics_and_stop_on_sigterm(
    two_workers: tuple[str, asyncio.subprocess.Process],
) -> None:
    url, proc = two_workers
    served: dict[str, int] = {}
    sent = 0
    while len(served) < 2 and sent < 400:  # connections spread by source port: both soon
        pid, status = await _post(url, "wf-shared", f"agent-{sent % 3}")
        assert status == 200
        served[pid] = served.get(pid, 0) + 1
        sent += 1
    assert len(served) == 2, f"one worker served all {sent} requests"
    assert str(proc.pid) not in served  # workers serve, the parent does not

    async with aiohttp.ClientSession() as http:
        # /metrics, from whichever worker answers, counts both workers' requests (a request
        # is counted just after its answer is sent: ask until the last one is in)
        counts = []
        for _ in range(50):
            connector = aiohttp.TCPConnector(force_close=True)
            async with (
                aiohttp.ClientSession(connector=connector) as fresh,
                fresh.get(f"{url}/metrics") as resp,
            ):
                counts.append(metric_sum(await resp.text(), "hiveroute_requests_total"))
            if counts[-4:] == [sent] * 4:
                break
            await asyncio.sleep(0.05)
        assert counts[-4:] == [sent] * 4, counts
        # the workflow's record counts every request, whichever worker served it
        async with http.get(f"{url}/v1/workflows/wf-shared") as resp:
            assert resp.status == 200
            workflow = await resp.json()
        async with http.get(f"{url}/dashboard/api/overview") as resp:
            overview = await resp.json()
    assert len(workflow["requests"]) == sent
    assert overview["workers"] == 2  # the workflow GET above is counted too (engine "none")
    assert sum(e["requests"] for e in overview["engines"]) == sent

    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
    for pid in served:  # the workers are gone too
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
