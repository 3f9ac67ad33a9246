"""Targets start, answer through to the engines, and stop for good."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import aiohttp
import pytest

from hiveroute.bench.engines import Fleet
from hiveroute.bench.targets import TargetSpec, start_target
from hiveroute.errors import ConfigError
from tests.support.fake_engine import FakeEngine


async def test_hiveroute_subprocess_target_relays_and_stops(
    fake_engine: FakeEngine, fake_fleet: Fleet, tmp_path: Path
) -> None:
    target = await start_target(TargetSpec.parse("hiveroute:round_robin"), fake_fleet, tmp_path)
    try:
        body = {"model": "fake-model", "prompt": "hi", "max_tokens": 2, "stream": True}
        async with (
            aiohttp.ClientSession() as http,
            http.post(target.url + "/v1/completions", json=body) as response,
        ):
            assert response.status == 200
            assert b"[DONE]" in await response.read()
        assert fake_engine.received and fake_engine.received[0]["prompt"] == "hi"
    finally:
        await target.stop()
    assert [c.proc.returncode is not None for c in target._children] == [True]


async def test_a_router_target_runs_as_replicas_each_answering(
    fake_engine: FakeEngine, fake_fleet: Fleet, tmp_path: Path
) -> None:
    spec = TargetSpec.parse("hiveroute:round_robin")
    target = await start_target(spec, fake_fleet, tmp_path, replicas=2)
    try:
        assert len(set(target.urls)) == 2
        body = {"model": "fake-model", "prompt": "hi", "max_tokens": 2}
        async with aiohttp.ClientSession() as http:
            for url in target.urls:
                async with http.post(url + "/v1/completions", json=body) as response:
                    assert response.status == 200
        assert len(fake_engine.received) == 2
        if sys.platform == "linux":  # both replicas' CPU, read from /proc
            used = target.cpu_seconds()
            one = target._children[0].cpu_seconds()
            assert used is not None and one is not None and 0 < one < used
    finally:
        await target.stop()
    assert [c.proc.returncode is not None for c in target._children] == [True, True]
    assert target.cpu_seconds() is None  # its processes are gone
    assert (tmp_path / "target-hiveroute-round_robin.log").exists()
    assert (tmp_path / "target-hiveroute-round_robin-replica2.log").exists()
    with pytest.raises(ConfigError, match="replicas must be between 1 and 16"):
        await start_target(spec, fake_fleet, tmp_path, replicas=0)


@pytest.mark.parametrize("state", ["memory", "redis"])
async def test_replicas_share_a_workflow_only_when_their_state_is_in_redis(
    fake_fleet: Fleet, tmp_path: Path, state: str
) -> None:
    spec = TargetSpec.parse("hiveroute:workflow")
    target = await start_target(spec, fake_fleet, tmp_path, replicas=2, state=state)
    try:
        first, second = target.urls
        async with aiohttp.ClientSession() as http:
            async with http.post(first + "/v1/workflows", json={"id": "wf-shared"}) as created:
                assert created.status == 201
            async with http.get(second + "/v1/workflows/wf-shared") as seen:
                assert seen.status == (200 if state == "redis" else 404)
    finally:
        await target.stop()
    redis = target._redis
    assert (redis is not None) == (state == "redis")
    if redis is not None:
        assert redis.process is None  # stopped with the target
    with pytest.raises(ConfigError, match="state must be one of memory, redis"):
        await start_target(spec, fake_fleet, tmp_path, state="etcd")


@pytest.mark.parametrize("level", ["info", "warning"])
async def test_router_log_level_decides_whether_each_request_is_logged(
    fake_fleet: Fleet, tmp_path: Path, level: str
) -> None:
    spec = TargetSpec.parse("hiveroute:round_robin")
    target = await start_target(spec, fake_fleet, tmp_path, log_level=level)
    try:
        body = {"model": "fake-model", "prompt": "hi", "max_tokens": 2}
        headers = {"X-Request-Id": "logged-1"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(target.url + "/v1/completions", json=body, headers=headers) as response,
        ):
            assert response.status == 200
    finally:
        await target.stop()
    lines = (tmp_path / "target-hiveroute-round_robin.log").read_text().splitlines()
    requests = [json.loads(line) for line in lines if '"logged-1"' in line]
    if level == "warning":
        assert requests == []
    else:
        assert len(requests) == 1
        assert requests[0]["engine"] and requests[0]["policy"] == "round_robin"
        assert requests[0]["reason"] == "round_robin"


async def test_engine_target_is_the_first_engine_itself(tmp_path: Path) -> None:
    fleet = Fleet(specs=["http://127.0.0.1:1"], urls=["http://127.0.0.1:1"], kind="fake")
    target = await start_target(TargetSpec.parse("engine"), fleet, tmp_path, replicas=3)
    assert target.urls == ["http://127.0.0.1:1"]  # no router, so nothing to replicate
    assert target.cpu_seconds() is None  # and no router CPU
    await target.stop()


def test_targets_may_name_policies_the_user_defined(monkeypatch: pytest.MonkeyPatch) -> None:
    from hiveroute.bench.targets import TargetSpec
    from hiveroute.errors import ConfigError

    monkeypatch.delenv("HIVEROUTE_POLICIES", raising=False)
    monkeypatch.delenv("HIVEROUTE_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="HIVEROUTE_POLICIES"):
        TargetSpec.parse("hiveroute:sticky")
    custom = '{"sticky": {"scorers": [{"name": "session_affinity"}], "picker": "max_score"}}'
    monkeypatch.setenv("HIVEROUTE_POLICIES", custom)
    assert TargetSpec.parse("hiveroute:sticky").policy == "sticky"
