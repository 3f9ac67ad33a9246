"""KV events on ZMQ: three frames, vLLM 0.32 payloads, eviction, replay, restart, legacy."""

from __future__ import annotations

import aiohttp
import msgpack

from tests.sim.conftest import FleetFactory
from tests.sim.kv_subscriber import (
    Subscriber,
    decode_payload,
    removed_blocks,
    replay,
    stored_blocks,
)


async def _complete(
    session: aiohttp.ClientSession, url: str, prompt: list[int], **extra: object
) -> dict:
    resp = await session.post(
        f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1, **extra}
    )
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def test_block_stored_carries_token_ids_at_block_boundaries(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(block_size=16)
    engine = fleet.engines[0]
    sub = Subscriber(engine.events_endpoint or "")
    await sub.settle()
    prompt = list(range(1000, 1040))  # 2 full blocks and 8 tokens
    await _complete(session, engine.url, prompt)
    await _complete(
        session, engine.url, prompt + list(range(2000, 2030))
    )  # extends by 1 block... and more
    events = await sub.drain()
    sub.close()
    first, second = (e for e in events if e["type"] == "BlockStored")
    assert first == {
        "type": "BlockStored",
        "block_hashes": first["block_hashes"],
        "parent_block_hash": None,
        "token_ids": prompt[:32],
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None, None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in first["block_hashes"])
    # The second request hit the first two blocks and stored the next two, chained to them.
    assert second["parent_block_hash"] == first["block_hashes"][1]
    assert stored_blocks([second]) == [
        (prompt + list(range(2000, 2030)))[32:48],
        (prompt + list(range(2000, 2030)))[48:64],
    ]
    assert sub.seqs == list(range(len(sub.seqs)))


async def test_eviction_publishes_block_removed(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(block_size=16, num_blocks=5)  # 4 usable blocks
    engine = fleet.engines[0]
    sub = Subscriber(engine.events_endpoint or "")
    await sub.settle()
    a, b, c = (list(range(base, base + 33)) for base in (100, 200, 300))  # 2 full blocks each
    for prompt in (a, b, c):
        await _complete(session, engine.url, prompt)
    events = await sub.drain()
    sub.close()
    # Each request frees its blocks tail first, so the least recently used is a's last block.
    assert removed_blocks(events) == [a[16:32], a[:16], b[16:32]]
    hit = await _complete(session, engine.url, a)
    assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # a was evicted


async def test_replay_returns_buffered_batches_then_end_marker(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    engine = fleet.engines[0]
    for base in (100, 200, 300):
        await _complete(session, engine.url, list(range(base, base + 20)))
    batches = await replay(engine.replay_endpoint or "", 1)
    assert [seq for seq, _ in batches] == [1, 2]
    _, events = decode_payload(batches[0][1])
    assert events[0]["token_ids"] == list(range(200, 216))
    assert await replay(engine.replay_endpoint or "", 99) == []


async def test_restart_starts_sequence_numbers_again(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    engine = fleet.engines[0]
    sub = Subscriber(engine.events_endpoint or "")
    await sub.settle()
    for base in (100, 200):
        await _complete(session, engine.url, list(range(base, base + 20)))
    await sub.drain()
    resp = await session.post(f"{engine.url}/sim/events/restart")
    assert (await resp.json())["events"] == engine.events_endpoint
    await sub.settle()  # the subscriber reconnects to the rebound socket by itself
    await _complete(session, engine.url, list(range(300, 320)))
    await sub.drain()
    sub.close()
    assert sub.seqs == [0, 1, 0]


async def test_legacy_array_encoding(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet(legacy_event_encoding=True, num_blocks=3)
    engine = fleet.engines[0]
    sub = Subscriber(engine.events_endpoint or "")
    await sub.settle()
    await _complete(session, engine.url, list(range(100, 117)))
    await _complete(session, engine.url, list(range(200, 217)))
    events = await sub.drain()
    sub.close()
    assert [e["type"] for e in events] == ["BlockStored", "BlockRemoved", "BlockStored"]
    raw = msgpack.unpackb((await replay(engine.replay_endpoint or "", 0))[0][1])
    assert raw[1][0][:2] == ["BlockStored", events[0]["block_hashes"]]  # arrays, not maps
    assert events[0]["token_ids"] == list(range(100, 116)) and events[0]["medium"] == "GPU"


async def test_reset_prefix_cache_publishes_all_blocks_cleared(
    sim_fleet: FleetFactory, session: aiohttp.ClientSession
) -> None:
    fleet = await sim_fleet()
    engine = fleet.engines[0]
    sub = Subscriber(engine.events_endpoint or "")
    await sub.settle()
    await _complete(session, engine.url, list(range(100, 120)))
    assert (await session.post(f"{engine.url}/reset_prefix_cache")).status == 200
    events = await sub.drain()
    sub.close()
    assert events[-1] == {"type": "AllBlocksCleared"}
