"""`hiveroute sim` flags, presets, fleets of several engines and the embedded start-up."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from hiveroute.cli import build_parser
from hiveroute.engines.engine import EngineSpec
from hiveroute.errors import ConfigError
from hiveroute.sim import SimConfig, SimFleet
from hiveroute.sim.command import config_from_args, parse_bytes
from hiveroute.sim.embedded import start_embedded_engines
from hiveroute.sim.presets import LLAMA_8B_H100, LLAMA_70B_4XH100, PRESETS


def test_cli_flags_build_the_config() -> None:
    args = build_parser().parse_args(
        ["sim", "--engines", "3", "--base-port", "9100", "--events-base-port", "6557", "--block-size", "32",
         "--preset", "llama-70b-4xh100", "--kv-memory", "8GiB", "--max-num-seqs", "64",
         "--scheduling-policy", "priority", "--fail-fraction", "0.25", "--stall-first-token", "1.5",
         "--legacy-events", "--model", "m"]
    )  # fmt: skip
    config = config_from_args(args)
    assert (config.engines, config.base_port, config.events_base_port, config.block_size) == (
        3,
        9100,
        6557,
        32,
    )
    assert (
        config.kv_memory_bytes == 8 * 2**30 and config.seqs() == 64 and config.model_name() == "m"
    )
    assert config.scheduling_policy == "priority" and config.legacy_event_encoding
    assert config.faults.fail_fraction == 0.25 and config.faults.stall_first_token_s == 1.5
    assert config.blocks() == 8 * 2**30 // (LLAMA_70B_4XH100.kv_bytes_per_token * 32)
    assert config.replay_port(1) == 6658
    assert config.host == "127.0.0.1"


def test_bad_values_say_what_to_do() -> None:
    with pytest.raises(ConfigError, match="preset"):
        SimConfig(preset="nope").validate()
    with pytest.raises(ConfigError, match="fail_fraction"):
        args = build_parser().parse_args(["sim", "--fail-fraction", "3"])
        config_from_args(args)
    with pytest.raises(ConfigError, match="scheduling-policy"):
        SimConfig(scheduling_policy="lifo").validate()
    with pytest.raises(ConfigError, match="chunked prefill"):
        SimConfig(
            enable_chunked_prefill=False, max_model_len=100_000, max_num_batched_tokens=8192
        ).validate()
    assert parse_bytes("54GB") == 54 * 10**9 and parse_bytes("1024") == 1024


def test_presets_are_real_setups_with_sane_figures() -> None:
    assert {"llama-8b-h100", "llama-70b-4xh100", "fast"} <= set(PRESETS)
    small, big = LLAMA_8B_H100.cost, LLAMA_70B_4XH100.cost
    # A batch-1 decode step of 8B on H100 is a few ms; 70B on 4xH100 takes longer.
    assert 0.004 < small.step_time(0, 0, 1, 1000) < 0.010 < big.step_time(0, 0, 1, 1000)
    # A cached prefix is never scheduled: 2000 new tokens cost the same with or without 8000 cached
    # ones apart from attention over them.
    assert small.step_time(2000, 0, 0, 0) < small.step_time(10000, 0, 0, 0) / 4
    assert 20_000 < LLAMA_8B_H100.num_blocks(16) < 40_000


async def test_fleet_of_two_engines_with_their_own_ports(session: aiohttp.ClientSession) -> None:
    fleet = SimFleet(SimConfig(engines=2, base_port=0, events_base_port=0, preset="fast"))
    await fleet.start()
    try:
        specs = [EngineSpec.parse(text) for text in fleet.engine_spec_texts()]
        assert [s.url for s in specs] == [e.url for e in fleet.engines]
        assert [s.events for s in specs] == [e.events_endpoint for e in fleet.engines]
        assert all(s.replay for s in specs) and len({s.url for s in specs}) == 2
        for engine in fleet.engines:
            assert (await session.get(f"{engine.url}/health")).status == 200
        # The engines are independent: a prefix cached on one is not on the other.
        body = {"prompt": list(range(100, 140)), "max_tokens": 1}
        await session.post(f"{fleet.engines[0].url}/v1/completions", json=body)
        other = await (
            await session.post(f"{fleet.engines[1].url}/v1/completions", json=body)
        ).json()
        assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        await fleet.stop()


async def test_embedded_falls_back_to_free_ports_when_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        fleet, specs = await start_embedded_engines(
            1, base_port=port, events_base_port=0, preset="fast"
        )
        try:
            assert len(specs) == 1 and f":{port}," not in specs[0]
            assert EngineSpec.parse(specs[0]).events
        finally:
            await fleet.stop()


async def test_real_tokenizer_directory(tmp_path: object, session: aiohttp.ClientSession) -> None:
    from pathlib import Path

    from hiveroute.engines.vllm_local import _train_tokenizer
    from hiveroute.kvindex.tokenizer import HFTokenizer, prompt_token_ids

    directory = Path(str(tmp_path))
    _train_tokenizer(directory, 500)
    fleet = SimFleet(
        SimConfig(base_port=0, events_base_port=0, preset="fast", tokenizer=str(directory))
    )
    await fleet.start()
    try:
        url = fleet.engines[0].url
        body = {
            "messages": [{"role": "user", "content": "the agent plans the task"}],
            "max_tokens": 4,
        }
        expected = prompt_token_ids(HFTokenizer(directory), "/v1/chat/completions", body)
        tokens = await (await session.post(f"{url}/tokenize", json=body)).json()
        assert tokens["tokens"] == expected
        out = await (await session.post(f"{url}/v1/chat/completions", json=body)).json()
        assert (
            out["usage"]["prompt_tokens"] == len(expected)
            and out["choices"][0]["message"]["content"]
        )
    finally:
        await fleet.stop()
