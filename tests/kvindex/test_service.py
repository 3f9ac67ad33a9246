"""The router's KV wiring: tokenizer and index in services, one subscriber per events engine."""

import argparse

import pytest
import zmq.asyncio

from hiveroute.assembly import assemble
from hiveroute.config import RouterConfig, add_config_arguments, load_config
from hiveroute.engines.engine import EngineSpec
from hiveroute.errors import ConfigError
from hiveroute.kvindex.index import KvIndex
from hiveroute.kvindex.tokenizer import BuiltinTokenizer
from tests.kvindex.zmq_publisher import FakePublisher, stored, wait_until


async def test_router_subscribes_to_engines_with_events_and_follows_the_pool() -> None:
    ctx = zmq.asyncio.Context()
    pub = FakePublisher(ctx)
    config = RouterConfig(
        engine=[
            f"http://127.0.0.1:9,events={pub.endpoint},replay={pub.replay_endpoint}",
            "http://127.0.0.1:10",
        ],
        policy="kv",
        kv_index_max_blocks=1000,
        health_interval_s=60,
    ).validate()
    router = assemble(config)
    assert isinstance(router.tokenizer, BuiltinTokenizer)
    index: KvIndex = router.kv_index
    assert index.max_blocks == 1000
    await router.start()
    try:
        events = router.kv_events
        assert set(events.subscribers) == {"127.0.0.1:9"}
        await pub.wait_subscribed()
        await events.subscribers["127.0.0.1:9"].synced.wait()
        await pub.publish([stored([1, 2], list(range(8)))])
        await wait_until(lambda: index.engine_hashes("127.0.0.1:9") == {1, 2})
        metrics = router.metrics.render().decode()
        assert "hiveroute_kv_index_blocks 2.0" in metrics
        assert 'hiveroute_kv_events_total{engine="127.0.0.1:9"} 1.0' in metrics
        router.pool.add(EngineSpec.parse(f"http://127.0.0.1:11,events={pub.endpoint}"))
        assert set(events.subscribers) == {"127.0.0.1:9", "127.0.0.1:11"}
        router.pool.remove("127.0.0.1:9")
        assert set(events.subscribers) == {"127.0.0.1:11"}
        assert index.engine_hashes("127.0.0.1:9") == set()
    finally:
        await router.stop()
        await pub.close()
        ctx.term()


def test_tokenizer_and_index_settings_are_checked() -> None:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(["--tokenizer", "/nonexistent", "--policy", "kv"])
    with pytest.raises(ConfigError, match=r"tokenizer\.json"):
        load_config(args, env={})
    with pytest.raises(ConfigError, match="kv_index_max_blocks"):
        load_config({"kv_index_max_blocks": 0}, env={})
    assert load_config({"tokenizer": "builtin"}, env={}).tokenizer == "builtin"
