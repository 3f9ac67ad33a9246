"""Kubernetes discovery against a fake API server: the pool follows the engine pods."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from hiveroute.assembly import assemble
from hiveroute.config import RouterConfig, load_config
from hiveroute.engines.discovery_k8s import (
    Backoff,
    KubernetesDiscovery,
    PodEndpoints,
    _lines,
    serving_ip,
)
from hiveroute.engines.pool import EnginePool
from hiveroute.errors import ConfigError
from tests.deploy.fake_kube_api import FakeKubeApi


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Wait (bounded) until `check()` holds; the discovery thread works asynchronously."""
    for _ in range(int(timeout_s / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
async def fake() -> AsyncIterator[FakeKubeApi]:
    api = FakeKubeApi()
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
def kubeconfig(fake: FakeKubeApi, tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(fake.kubeconfig(namespace="engines"))
    return str(path)


def urls(pool: EnginePool) -> set[str]:
    return {e.url for e in pool.engines}


async def start_discovery(kubeconfig: str, **kwargs: Any) -> tuple[KubernetesDiscovery, EnginePool]:
    pool = EnginePool(health_interval_s=3600)
    kwargs.setdefault("backoff", Backoff(0.01, 0.05))
    discovery = KubernetesDiscovery(
        pool, label_selector="hiveroute.io/role=engine", kubeconfig=kubeconfig, **kwargs
    )
    await discovery.start()
    return discovery, pool


async def test_router_pool_follows_pods_through_their_lifecycle(
    fake: FakeKubeApi, kubeconfig: str
) -> None:
    fake.put("engine-0", phase="Pending", ready=False)  # scheduled, no IP yet
    fake.put("engine-1", ip="10.1.0.11")
    fake.put("other", ip="10.1.0.99", labels={"app": "something-else"})
    fake.put("elsewhere", ip="10.1.0.98", namespace="kube-system")
    config = load_config(
        {
            "discovery": "kubernetes",
            "k8s_kubeconfig": kubeconfig,
            "k8s_port": 8000,
            "k8s_events_port": 5557,
            "k8s_replay_port": 5558,
            "health_interval_s": 3600,
        },
        env={},
    )
    router = assemble(config)
    await router.start()
    try:
        # the namespace came from the kubeconfig context; the initial list is applied by start()
        assert urls(router.pool) == {"http://10.1.0.11:8000"}
        engine = router.pool.get("10.1.0.11:8000")
        assert engine is not None
        assert engine.spec.events == "tcp://10.1.0.11:5557"
        assert engine.spec.replay == "tcp://10.1.0.11:5558"
        assert fake.lists[0]["labelSelector"] == "hiveroute.io/role=engine"

        fake.put("engine-0", phase="Running", ready=False, ip="10.1.0.10")  # running, not ready
        fake.put("engine-2", ip="10.1.0.12")
        await eventually(lambda: "http://10.1.0.12:8000" in urls(router.pool), "engine-2")
        assert "http://10.1.0.10:8000" not in urls(router.pool)

        fake.put("engine-0", ip="10.1.0.10")  # becomes ready
        await eventually(lambda: "http://10.1.0.10:8000" in urls(router.pool), "engine-0 ready")

        fake.put("engine-1", ready=False, ip="10.1.0.11")  # fails its readiness probe
        await eventually(lambda: "http://10.1.0.11:8000" not in urls(router.pool), "unready")

        fake.put("engine-2", ip="10.1.0.12", terminating=True)  # being deleted: stop routing
        await eventually(lambda: "http://10.1.0.12:8000" not in urls(router.pool), "terminating")

        fake.delete("engine-0")
        await eventually(lambda: urls(router.pool) == set(), "deleted")
        assert len(fake.lists) == 1  # all of this came through one watch
    finally:
        await router.stop()


async def test_watch_drop_resumes_from_last_resource_version(
    fake: FakeKubeApi, kubeconfig: str
) -> None:
    fake.put("engine-0", ip="10.1.0.10")
    discovery, pool = await start_discovery(kubeconfig)
    try:
        await eventually(lambda: fake.open_watches == 1, "a watch")
        fake.put("engine-1", ip="10.1.0.11")
        await eventually(lambda: len(pool.engines) == 2, "engine-1")
        seen = fake.version

        fake.drop_watches()
        await eventually(lambda: len(fake.watches) == 2 and fake.open_watches == 1, "re-watch")
        assert fake.watches[1]["resourceVersion"] == str(seen)
        fake.put("engine-2", ip="10.1.0.12")
        fake.delete("engine-0")
        await eventually(
            lambda: urls(pool) == {"http://10.1.0.11:8000", "http://10.1.0.12:8000"},
            "changes after the drop",
        )
        assert len(fake.lists) == 1  # resumed, not re-listed
    finally:
        await discovery.stop()


async def test_410_gone_forces_a_relist_that_reconciles_missed_changes(
    fake: FakeKubeApi, kubeconfig: str
) -> None:
    fake.put("engine-0", ip="10.1.0.10")
    fake.put("engine-1", ip="10.1.0.11")
    discovery, pool = await start_discovery(kubeconfig)
    try:
        await eventually(lambda: fake.open_watches == 1, "a watch")
        # changes the watch never reports, then the history is compacted away
        fake.delete("engine-0", notify=False)
        fake.put("engine-2", ip="10.1.0.12", notify=False)
        fake.expire()
        await eventually(lambda: len(fake.lists) == 2, "a second list")
        await eventually(
            lambda: urls(pool) == {"http://10.1.0.11:8000", "http://10.1.0.12:8000"},
            "the pool reconciled with the new list",
        )
        assert discovery.engines == {
            "engines/engine-1": "http://10.1.0.11:8000",
            "engines/engine-2": "http://10.1.0.12:8000",
        }
    finally:
        await discovery.stop()


async def test_watch_from_a_compacted_version_relists(fake: FakeKubeApi, kubeconfig: str) -> None:
    fake.put("engine-0", ip="10.1.0.10")
    discovery, pool = await start_discovery(kubeconfig)
    try:
        await eventually(lambda: fake.open_watches == 1, "a watch")
        # the connection drops, and before the watch resumes its version is compacted away:
        # the resumed watch is answered with a 410 ERROR event, and discovery lists again
        fake.put("engine-1", ip="10.1.0.11", notify=False)
        fake.drop_watches()
        fake.expire()
        await eventually(lambda: len(fake.lists) == 2 and fake.open_watches == 1, "recovery")
        assert len(fake.watches) >= 3  # the first, the one answered 410, the one after the list
        assert len(pool.engines) == 2
        fake.put("engine-2", ip="10.1.0.12")
        await eventually(lambda: len(pool.engines) == 3, "engine-2 after recovery")
    finally:
        await discovery.stop()


async def test_a_paged_list_is_read_to_the_end(fake: FakeKubeApi, kubeconfig: str) -> None:
    for i in range(5):
        fake.put(f"engine-{i}", ip=f"10.1.0.{10 + i}")
    discovery, pool = await start_discovery(kubeconfig, page_size=2)
    try:
        assert len(pool.engines) == 5
        assert [q.get("continue") for q in fake.lists] == [None, "2", "4"]
        assert all(q["limit"] == "2" for q in fake.lists)
    finally:
        await discovery.stop()


async def test_errors_back_off_and_recover(fake: FakeKubeApi, kubeconfig: str) -> None:
    fake.put("engine-0", ip="10.1.0.10")
    fake.failures = [500, 403]
    discovery, pool = await start_discovery(kubeconfig)
    try:
        assert urls(pool) == {"http://10.1.0.10:8000"}  # start() waited for the first good list
        assert len(fake.lists) == 3
        assert discovery.watcher is not None and discovery.watcher.last_error is None
    finally:
        await discovery.stop()


async def test_a_watch_that_worked_then_dropped_waits_from_the_shortest_delay(
    fake: FakeKubeApi, kubeconfig: str
) -> None:
    """The backoff was reset only by a successful list: every watch drop over the process's
    life (an API server restart, a connection reset) doubled it, until each later drop left
    pods unseen for up to its maximum."""

    class CountingBackoff(Backoff):
        def __init__(self) -> None:
            super().__init__(0.01, 0.05)
            self.resets = 0

        def reset(self) -> None:
            self.resets += 1
            super().reset()

    backoff = CountingBackoff()
    fake.put("engine-0", ip="10.1.0.10")
    discovery, pool = await start_discovery(kubeconfig, backoff=backoff)
    try:
        for i in range(1, 4):
            await eventually(lambda i=i: len(fake.watches) == i and fake.open_watches == 1, "watch")
            fake.put(f"engine-{i}", ip=f"10.1.0.1{i}")  # the watch delivers an event, then drops
            await eventually(lambda i=i: len(pool.engines) == i + 1, f"engine-{i}")
            fake.drop_watches()
        await eventually(lambda: len(fake.watches) == 4, "the fourth watch")
        assert backoff.resets == 4  # the list, then each watch that worked
        assert len(fake.lists) == 1
    finally:
        await discovery.stop()


async def test_forbidden_is_reported_with_the_rbac_hint(fake: FakeKubeApi, kubeconfig: str) -> None:
    fake.failures = [403] * 1000
    discovery, pool = await start_discovery(kubeconfig, initial_sync_timeout_s=0.3)
    try:
        assert pool.engines == []
        assert discovery.watcher is not None
        await eventually(lambda: discovery.watcher.last_error is not None, "an error")  # type: ignore[union-attr]
        assert "service account needs get/list/watch on pods" in str(discovery.watcher.last_error)
    finally:
        await discovery.stop()


async def test_stop_interrupts_an_idle_watch(fake: FakeKubeApi, kubeconfig: str) -> None:
    discovery, _pool = await start_discovery(kubeconfig, watch_timeout_s=3600)
    await eventually(lambda: fake.open_watches == 1, "a watch")
    thread = discovery._thread
    assert thread is not None
    await discovery.stop()  # joins with a 10 s limit, far below the watch's 3600 s
    assert not thread.is_alive()


async def test_discovery_leaves_static_engines_alone(fake: FakeKubeApi, kubeconfig: str) -> None:
    from hiveroute.engines.engine import EngineSpec

    fake.put("engine-0", ip="10.1.0.10")
    pool = EnginePool([EngineSpec.parse("http://127.0.0.1:9")], health_interval_s=3600)
    discovery = KubernetesDiscovery(
        pool, label_selector="hiveroute.io/role=engine", kubeconfig=kubeconfig
    )
    await discovery.start()
    try:
        fake.delete("engine-0")
        await eventually(lambda: urls(pool) == {"http://127.0.0.1:9"}, "engine-0 removed")
    finally:
        await discovery.stop()


async def test_a_pod_at_a_static_engines_address_leaves_that_engine_as_given(
    fake: FakeKubeApi, kubeconfig: str
) -> None:
    """A pod discovered at the address of an engine given with --engine replaced that engine's
    spec (its own events endpoint lost), and the pod's deletion then removed it from the pool."""
    from hiveroute.engines.engine import EngineSpec

    static = EngineSpec.parse("http://10.1.0.10:8000,events=tcp://10.1.0.10:7000")
    pool = EnginePool([static], health_interval_s=3600)
    fake.put("engine-0", ip="10.1.0.10")
    fake.put("engine-1", ip="10.1.0.11")
    discovery = KubernetesDiscovery(
        pool, label_selector="hiveroute.io/role=engine", kubeconfig=kubeconfig
    )
    await discovery.start()
    try:
        assert urls(pool) == {"http://10.1.0.10:8000", "http://10.1.0.11:8000"}
        assert pool.get("10.1.0.10:8000").spec == static  # type: ignore[union-attr]
        fake.delete("engine-0")
        fake.delete("engine-1")
        await eventually(lambda: urls(pool) == {"http://10.1.0.10:8000"}, "engine-1 removed")
        assert pool.get("10.1.0.10:8000").spec == static  # type: ignore[union-attr]
    finally:
        await discovery.stop()


async def test_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    discovery = KubernetesDiscovery(
        EnginePool(), label_selector="a=b", kubeconfig=str(tmp_path / "absent")
    )
    with pytest.raises(ConfigError, match="cannot load credentials"):
        await discovery.start()


def test_serving_ip_needs_running_ready_ip_and_no_deletion() -> None:
    def pod(phase: str = "Running", ready: str = "True", ip: str | None = "10.0.0.1") -> Any:
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": ready}],
        }
        if ip:
            status["podIP"] = ip
        return {"metadata": {"name": "p"}, "status": status}

    assert serving_ip(pod()) == "10.0.0.1"
    assert serving_ip(pod(phase="Pending")) is None
    assert serving_ip(pod(phase="Succeeded")) is None
    assert serving_ip(pod(ready="False")) is None
    assert serving_ip(pod(ip=None)) is None
    deleting = pod()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert serving_ip(deleting) is None
    assert serving_ip({"metadata": {}}) is None


def test_endpoints_from_pod_ip() -> None:
    spec = PodEndpoints(port=8000, events_port=5557, replay_port=0).spec_for("fd00::5")
    assert spec.url == "http://[fd00::5]:8000"
    assert spec.events == "tcp://[fd00::5]:5557"
    assert spec.replay is None
    assert PodEndpoints(events_port=0).spec_for("10.0.0.1").events is None
    assert PodEndpoints(scheme="https", port=443).spec_for("10.0.0.1").url == "https://10.0.0.1:443"


def test_watch_lines_split_across_chunks() -> None:
    chunks = [b'{"a":', b'1}\n{"b"', b":2}\n\n", b'{"c":3}']
    assert list(_lines(iter(chunks))) == [b'{"a":1}', b'{"b":2}', b'{"c":3}']


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"discovery": "consul"}, "discovery must be"),
        ({"discovery": "kubernetes", "k8s_label_selector": " "}, "must not be empty"),
        ({"k8s_port": 0}, "k8s_port must be 1..65535"),
        ({"k8s_events_port": 70000}, "k8s_events_port"),
        ({"k8s_scheme": "grpc"}, "k8s_scheme"),
        ({"state": "redis:/nohost"}, "state must be"),
        ({"state": "postgres://db"}, "state must be"),
    ],
)
def test_bad_discovery_and_state_settings_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(values, env={})


def test_settings_from_environment() -> None:
    config: RouterConfig = load_config(
        {},
        env={
            "HIVEROUTE_DISCOVERY": "kubernetes",
            "HIVEROUTE_K8S_NAMESPACE": "llm",
            "HIVEROUTE_K8S_EVENTS_PORT": "0",
            "HIVEROUTE_STATE": "rediss://cache.internal:6380/2",
        },
    )
    assert (config.discovery, config.k8s_namespace, config.k8s_events_port) == (
        "kubernetes",
        "llm",
        0,
    )
    assert config.state == "rediss://cache.internal:6380/2"


async def test_router_that_cannot_start_discovery_leaks_nothing(tmp_path: Path) -> None:
    config = load_config(
        {"discovery": "kubernetes", "k8s_kubeconfig": str(tmp_path / "absent")}, env={}
    )
    router = assemble(config)
    with pytest.raises(ConfigError, match="cannot load credentials"):
        await router.start()
    assert router.engine_client._session is None  # the HTTP session was closed, pool stopped
