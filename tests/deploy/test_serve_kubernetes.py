"""`hiveroute serve --discovery kubernetes` as a user runs it, against the fake API server."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from hiveroute.runtime import free_port
from tests.deploy.fake_kube_api import FakeKubeApi
from tests.support.fake_engine import FakeEngine


async def poll_health(http: aiohttp.ClientSession, url: str, want: int) -> dict[str, Any]:
    """The router's /health once it lists `want` engines (bounded wait)."""
    body: dict[str, Any] = {}
    for _ in range(200):
        try:
            async with http.get(f"{url}/health") as resp:
                body = await resp.json()
                if len(body["engines"]) == want:
                    return body
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"/health never listed {want} engine(s); last: {body}")


async def test_serve_routes_to_discovered_pods_and_stops_promptly(tmp_path: Path) -> None:
    fake, engine = FakeKubeApi(), FakeEngine()
    await fake.start()
    await engine.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(fake.kubeconfig(namespace="engines"))
    fake.put("vllm-0", ip="127.0.0.1")
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hiveroute", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--discovery", "kubernetes", "--k8s-kubeconfig", str(kubeconfig),
        "--k8s-port", str(engine.port), "--k8s-events-port", "0", "--health-interval-s", "0.2",
        "--workers", "1",  # one process, one watch (each worker of several watches itself)
        stderr=asyncio.subprocess.DEVNULL, env=dict(os.environ),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            health = await poll_health(http, url, 1)
            assert health["engines"][0]["url"] == engine.url
            body = {"model": "m", "prompt": "p", "max_tokens": 1}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                assert resp.headers["X-Hiveroute-Engine"] == f"127.0.0.1:{engine.port}"

            fake.put("vllm-0", ready=False, ip="127.0.0.1")  # the pod fails its readiness probe
            await poll_health(http, url, 0)
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 503
                assert (await resp.json())["error"]["code"] == "no_engine_available"
        assert fake.open_watches == 1
        proc.send_signal(signal.SIGTERM)  # the watch is open: stop must break it off
        assert await asyncio.wait_for(proc.wait(), timeout=20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await engine.stop()
        await fake.stop()
