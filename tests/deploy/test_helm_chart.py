"""The Helm chart renders (with Helm's own engine) into manifests the Kubernetes API accepts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from kubernetes import client

from hiveroute.config import RouterConfig, load_config
from hiveroute.engines.engine import EngineSpec
from hiveroute.engines.vllm_local import vllm_python
from tests.deploy.k8s_schema import SchemaError, validate, validate_service_monitor

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "hiveroute"
DASHBOARDS = ROOT / "deploy" / "grafana"

EVERYTHING_ON = {
    "engine": {"enabled": True},
    "redis": {"enabled": True},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "discovery": {"replayPort": 5558},
    "router": {"replicaCount": 3, "config": {"policy": "kv", "log_level": "debug"}},
}


def render(
    values: dict[str, Any] | None = None, chart: Path = CHART, namespace: str = "llm"
) -> tuple[list[dict[str, Any]], str]:
    """Every object the chart renders, plus its NOTES."""
    with helm.Chart.load(str(chart)) as loaded:
        files = loaded.render(values or {}, name="hr", namespace=namespace)
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in files.items():
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects, notes


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in by_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name} rendered {len(found)} times"
    return found[0]


def validate_all(objects: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    models: dict[tuple[str, str], Any] = {}
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            validate_service_monitor(obj)
        else:
            models[(obj["kind"], obj["metadata"]["name"])] = validate(obj)
    return models


def router_config(objects: list[dict[str, Any]], tmp_path: Path) -> RouterConfig:
    """The router's config file from the ConfigMap, loaded as `hiveroute serve` loads it."""
    text = one(objects, "ConfigMap", "hr-hiveroute")["data"]["hiveroute.yaml"]
    path = tmp_path / "hiveroute.yaml"
    path.write_text(text)
    config: RouterConfig = load_config({"config": str(path)}, env={})
    return config


def check_wiring(models: dict[tuple[str, str], Any]) -> None:
    """References between objects resolve: selectors, named ports, config maps, accounts."""
    deployments = [m for (kind, _), m in models.items() if kind == "Deployment"]
    pod_labels = []
    for dep in deployments:
        spec: client.V1DeploymentSpec = dep.spec
        labels = spec.template.metadata.labels
        assert spec.selector.match_labels.items() <= labels.items(), dep.metadata.name
        pod_labels.append(labels)
        pod = spec.template.spec
        volumes = {v.name: v for v in pod.volumes or []}
        for container in pod.containers:
            ports = {p.name for p in container.ports or []}
            for probe in (container.readiness_probe, container.liveness_probe):
                if probe is None:
                    continue
                target = (probe.http_get or probe.tcp_socket).port
                assert isinstance(target, int) or target in ports, (container.name, target)
            for mount in container.volume_mounts or []:
                assert mount.name in volumes, (dep.metadata.name, mount.name)
        for volume in volumes.values():
            if volume.config_map is not None:
                assert ("ConfigMap", volume.config_map.name) in models
        account = pod.service_account_name
        if account:
            assert ("ServiceAccount", account) in models
    for (kind, name), service in models.items():
        if kind != "Service":
            continue
        selector = service.spec.selector
        assert any(selector.items() <= labels.items() for labels in pod_labels), name
    for (kind, name), binding in models.items():
        if kind == "RoleBinding":
            assert ("Role", binding.role_ref.name) in models, name
            for subject in binding.subjects:
                assert ("ServiceAccount", subject.name) in models


def test_defaults_render_valid_objects(tmp_path: Path) -> None:
    objects, notes = render()
    models = validate_all(objects)
    kinds = sorted({k for k, _ in models})
    assert {"ConfigMap", "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"} <= set(
        kinds
    )
    assert not by_kind(objects, "ServiceMonitor")
    assert [d["metadata"]["name"] for d in by_kind(objects, "Deployment")] == ["hr-hiveroute"]
    check_wiring(models)

    config = router_config(objects, tmp_path)
    assert config.discovery == "kubernetes"
    assert config.k8s_namespace == "llm"
    assert config.k8s_label_selector == "hiveroute.io/role=engine"
    assert (config.k8s_port, config.k8s_events_port, config.port) == (8000, 5557, 8080)
    assert config.state == "memory"
    # the policy the README, CLI and demo default to, fed by the KV events configured above
    assert config.policy == RouterConfig().policy == "workflow"

    role = one(objects, "Role", "hr-hiveroute-discovery")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    router = one(objects, "Deployment", "hr-hiveroute")["spec"]["template"]["spec"]
    assert router["containers"][0]["args"] == ["--config", "/etc/hiveroute/hiveroute.yaml"]
    assert router["securityContext"]["runAsNonRoot"] is True
    # a release named "hiveroute" has a Service "hiveroute": its link variables would include
    # HIVEROUTE_PORT=tcp://..., read by the router as its port (a crash loop)
    assert router["enableServiceLinks"] is False
    assert "hr-hiveroute.llm.svc:8080" in notes


def test_everything_enabled(tmp_path: Path) -> None:
    objects, notes = render(EVERYTHING_ON)
    models = validate_all(objects)
    check_wiring(models)

    config = router_config(objects, tmp_path)
    assert config.state == "redis://hr-hiveroute-redis:6379/0"
    assert (config.policy, config.log_level, config.k8s_replay_port) == ("kv", "debug", 5558)
    assert ("Service", "hr-hiveroute-redis") in models
    assert one(objects, "Deployment", "hr-hiveroute")["spec"]["replicas"] == 3
    assert "WARNING" not in notes  # shared state: several replicas agree

    monitor = by_kind(objects, "ServiceMonitor")[0]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "http"  # the router Service's port name
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"

    engine = one(objects, "Deployment", "hr-hiveroute-engine")["spec"]["template"]
    # the example engines are what discovery selects
    assert engine["metadata"]["labels"]["hiveroute.io/role"] == "engine"
    vllm = engine["spec"]["containers"][0]
    args = vllm["args"]
    assert "--enable-prefix-caching" in args
    kv = json.loads(args[args.index("--kv-events-config") + 1])
    assert kv == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "topic": "kv-events",
        "replay_endpoint": "tcp://*:5558",
    }
    assert args[args.index("--port") + 1] == str(config.k8s_port)
    ports = {p["name"]: p["containerPort"] for p in vllm["ports"]}
    assert ports == {"http": 8000, "kv-events": 5557, "kv-replay": 5558}


def test_static_engines_and_external_redis(tmp_path: Path) -> None:
    values = {
        "discovery": {
            "mode": "static",
            "staticEngines": ["http://vllm-0.vllm:8000,events=tcp://vllm-0.vllm:5557"],
        },
        "redis": {"externalUrl": "rediss://cache.example:6380/1"},
    }
    objects, _ = render(values)
    models = validate_all(objects)
    check_wiring(models)
    assert not by_kind(objects, "Role")  # no discovery, no permission to list pods
    config = router_config(objects, tmp_path)
    assert config.discovery == "static"
    assert config.engine_specs == [
        EngineSpec("http://vllm-0.vllm:8000", events="tcp://vllm-0.vllm:5557")
    ]
    assert config.state == "rediss://cache.example:6380/1"


def test_redis_url_from_a_secret() -> None:
    objects, _ = render({"redis": {"existingSecret": "hiveroute-redis", "existingSecretKey": "u"}})
    validate_all(objects)
    env = one(objects, "Deployment", "hr-hiveroute")["spec"]["template"]["spec"]["containers"][0][
        "env"
    ]
    assert env == [
        {
            "name": "HIVEROUTE_STATE",
            "valueFrom": {"secretKeyRef": {"name": "hiveroute-redis", "key": "u"}},
        }
    ]


def test_engines_in_another_namespace_get_rbac_there() -> None:
    objects, _ = render({"discovery": {"namespace": "gpu"}, "engine": {"enabled": True}})
    validate_all(objects)
    assert one(objects, "Role", "hr-hiveroute-discovery")["metadata"]["namespace"] == "gpu"
    binding = one(objects, "RoleBinding", "hr-hiveroute-discovery")
    assert binding["metadata"]["namespace"] == "gpu"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "hr-hiveroute", "namespace": "llm"}
    ]
    assert one(objects, "Deployment", "hr-hiveroute-engine")["metadata"]["namespace"] == "gpu"


def test_several_replicas_in_memory_warn() -> None:
    _, notes = render({"router": {"replicaCount": 2}})
    assert "WARNING" in notes and "redis.enabled=true" in notes


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"discovery": {"mode": "dns"}}, "/discovery/mode"),
        ({"discovery": {"mode": "static"}}, "needs discovery.staticEngines"),
        ({"discovery": {"mod": "static"}}, "additional properties 'mod' not allowed"),
        ({"discovery": {"eventsPort": "5557"}}, "/discovery/eventsPort"),
        ({"discovery": {"port": 0}}, "/discovery/port"),
        ({"redis": {"externalUrl": "http://cache:6379"}}, "/redis/externalUrl"),
        ({"routr": {}}, "additional properties 'routr' not allowed"),
        (
            {"engine": {"enabled": True}, "discovery": {"labelSelector": "tier in (a,b)"}},
            "key=value terms",
        ),
    ],
)
def test_bad_values_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(values)


def test_dashboards_ship_as_a_labelled_configmap(tmp_path: Path) -> None:
    objects, _ = render()
    shipped = {p.name for p in DASHBOARDS.glob("*.json")}
    maps = [
        o
        for o in by_kind(objects, "ConfigMap")
        if o["metadata"]["name"] == "hr-hiveroute-dashboards"
    ]
    assert len(maps) == (1 if shipped else 0)

    chart = tmp_path / "hiveroute"
    shutil.copytree(CHART, chart, symlinks=False)  # the copy holds the linked folder's files
    dashboard = {"title": "hiveroute <test>", "panels": [{"type": "timeseries"}]}
    (chart / "dashboards" / "test-board.json").write_text(json.dumps(dashboard))
    objects, _ = render(
        {"grafana": {"dashboards": {"annotations": {"grafana_folder": "llm"}}}}, chart
    )
    models = validate_all(objects)
    cm = one(objects, "ConfigMap", "hr-hiveroute-dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "llm"}
    assert json.loads(cm["data"]["test-board.json"]) == dashboard
    assert set(cm["data"]) == shipped | {"test-board.json"}
    assert ("ConfigMap", "hr-hiveroute-dashboards") in models

    objects, _ = render({"grafana": {"dashboards": {"enabled": False}}}, chart)
    assert all(o["metadata"]["name"] != "hr-hiveroute-dashboards" for o in objects)


def test_helm_lint_finds_no_errors() -> None:
    result = helm.lint(str(CHART), EVERYTHING_ON, strict=True)
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] > 1] == []


def test_the_validator_rejects_what_the_api_would() -> None:
    good = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80, "targetPort": "http"}], "selector": {"a": "b"}},
    }
    validate(good)
    misspelt = {**good, "spec": {**good["spec"], "selectr": {"a": "b"}}}
    with pytest.raises(SchemaError, match="unknown field 'selectr'"):
        validate(misspelt)
    wrong_type = {**good, "spec": {"ports": [{"port": "80"}]}}
    with pytest.raises(SchemaError, match=r"spec.ports\[0\].port: expected an integer"):
        validate(wrong_type)
    missing = {**good, "spec": {"ports": [{"name": "http"}]}}  # port is required
    with pytest.raises(SchemaError, match="port"):
        validate(missing)
    with pytest.raises(SchemaError, match="not a DNS label"):
        validate({**good, "metadata": {"name": "Bad_Name"}})


PARSE_WITH_VLLM = """
import json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
ns = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))
kv = ns.kv_events_config
print(json.dumps({
    "model": ns.model_tag, "port": ns.port, "prefix_caching": ns.enable_prefix_caching,
    "prompt_tokens_details": ns.enable_prompt_tokens_details,
    "kv_events": kv.enable_kv_cache_events, "endpoint": kv.endpoint,
    "replay": kv.replay_endpoint, "topic": kv.topic, "publisher": kv.publisher,
}))
"""


@pytest.mark.realvllm
def test_example_engine_args_parse_with_real_vllm() -> None:
    """The chart's `vllm serve` arguments are ones real vLLM accepts, with the meaning we want."""
    objects, _ = render(EVERYTHING_ON)
    vllm = one(objects, "Deployment", "hr-hiveroute-engine")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert vllm["command"] == ["vllm", "serve"]
    done = subprocess.run(
        [str(vllm_python()), "-c", PARSE_WITH_VLLM, json.dumps(vllm["args"])],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed == {
        "model": "Qwen/Qwen2.5-1.5B-Instruct",
        "port": 8000,
        "prefix_caching": True,
        "prompt_tokens_details": True,
        "kv_events": True,
        "endpoint": "tcp://*:5557",
        "replay": "tcp://*:5558",
        "topic": "kv-events",
        "publisher": "zmq",
    }
