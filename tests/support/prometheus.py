"""A real Prometheus (Debian's `prometheus`) on a free loopback port, for tests.

Started with a generated config scraping the given targets every `scrape_interval_s`; queried
through its HTTP API. The TSDB lives in a temporary directory removed on stop.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from hiveroute.runtime import free_port


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
    )
    if found is None:
        raise RuntimeError("no prometheus on PATH: scripts/test installs Debian's prometheus")
    return found


class Prometheus:
    def __init__(self, jobs: dict[str, list[str]], scrape_interval_s: float = 1.0) -> None:
        self.jobs = jobs
        self.scrape_interval_s = scrape_interval_s
        self.dir = Path(tempfile.mkdtemp(prefix="hiveroute-prometheus-"))
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]}
                for job, targets in self.jobs.items()
            ],
        }

    async def start(self, timeout_s: float = 20.0) -> None:
        config_path = self.dir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(self.config()))
        self.port = free_port()
        self._process = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.dir / "prometheus.log").open("wb"),
        )
        self._http = aiohttp.ClientSession()
        deadline = time.monotonic() + timeout_s
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_tail()}")
            try:
                async with self._http.get(f"{self.url}/-/ready") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready in {timeout_s} s: {self.log_tail()}")
            await asyncio.sleep(0.1)

    def log_tail(self) -> str:
        path = self.dir / "prometheus.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (raises on a query Prometheus rejects)."""
        assert self._http is not None
        async with self._http.get(f"{self.url}/api/v1/query", params={"query": expr}) as resp:
            payload = await resp.json()
        if payload.get("status") != "success":
            raise ValueError(f"prometheus rejected {expr!r}: {payload.get('error')}")
        result: list[dict[str, Any]] = payload["data"]["result"]
        return result

    async def targets_up(self) -> dict[str, bool]:
        assert self._http is not None
        async with self._http.get(f"{self.url}/api/v1/targets") as resp:
            payload = await resp.json()
        return {t["scrapeUrl"]: t["health"] == "up" for t in payload["data"]["activeTargets"]}

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                await asyncio.to_thread(self._process.wait, 10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                await asyncio.to_thread(self._process.wait, 10)
        shutil.rmtree(self.dir, ignore_errors=True)
