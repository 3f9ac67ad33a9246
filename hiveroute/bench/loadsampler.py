"""Scrapes each engine's /metrics while a cell runs: per-engine load over time and the engines'
own prefix-cache and time-to-first-token counters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from hiveroute.bench.records import LoadSample
from hiveroute.engines.prom_text import parse_prometheus_text
from hiveroute.lifecycle import cancel_and_wait


class LoadSampler:
    def __init__(
        self,
        http: aiohttp.ClientSession,
        urls: list[str],
        clock: Callable[[], float],
        interval_s: float = 0.5,
    ) -> None:
        self.http = http
        self.urls = urls
        self.clock = clock
        self.interval_s = interval_s
        self.samples: list[LoadSample] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoadSampler:
        await self.sample_once()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await cancel_and_wait(self._task)
        await self.sample_once()

    async def _loop(self) -> None:
        while True:
            started = time.monotonic()
            await self.sample_once()
            await asyncio.sleep(max(0.05, self.interval_s - (time.monotonic() - started)))

    async def sample_once(self) -> None:
        await asyncio.gather(*(self._scrape(i, url) for i, url in enumerate(self.urls)))

    async def _scrape(self, index: int, url: str) -> None:
        try:
            async with self.http.get(
                url + "/metrics", timeout=aiohttp.ClientTimeout(total=2)
            ) as response:
                if response.status != 200:
                    return
                values = parse_prometheus_text(await response.text())
        except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
            return
        name = f"engine{index}"
        self.samples.append(
            LoadSample(
                t_s=self.clock(),
                engine=name,
                running=values.get("vllm:num_requests_running", 0.0),
                waiting=values.get("vllm:num_requests_waiting", 0.0),
                kv_usage=values.get("vllm:kv_cache_usage_perc", 0.0),
                prefix_queries=values.get("vllm:prefix_cache_queries_total"),
                prefix_hits=values.get("vllm:prefix_cache_hits_total"),
                requests_done=values.get("vllm:request_success_total"),
                ttft_sum=values.get("vllm:time_to_first_token_seconds_sum"),
                ttft_count=values.get("vllm:time_to_first_token_seconds_count"),
            )
        )
