"""Strict validation of Kubernetes manifests against the official client's API models.

`ApiClient().deserialize` ignores fields it does not know, which would let a misspelt or
misplaced key through; this walks each object through the models' `openapi_types` and
`attribute_map` instead, failing on unknown fields and wrong types, and builds every model
(pydantic, strict), so missing required fields and wrongly typed values fail too.
"""

from __future__ import annotations

import re
from typing import Any

from kubernetes import client

MODELS: dict[tuple[str, str], str] = {
    ("apps/v1", "Deployment"): "V1Deployment",
    ("v1", "Service"): "V1Service",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
}


class SchemaError(ValueError):
    pass


def _strict(data: Any, type_name: str, path: str) -> Any:
    if type_name.lower().startswith("list["):
        if not isinstance(data, list):
            raise SchemaError(f"{path}: expected a list, got {type(data).__name__}")
        return [_strict(v, type_name[5:-1], f"{path}[{i}]") for i, v in enumerate(data)]
    if type_name.lower().startswith(("dict(", "dict[")):
        if not isinstance(data, dict):
            raise SchemaError(f"{path}: expected a mapping, got {type(data).__name__}")
        inner = type_name[type_name.index(",") + 1 : -1].strip()
        return {k: _strict(v, inner, f"{path}.{k}") for k, v in data.items()}
    if type_name == "object":  # IntOrString and friends
        return data
    if type_name in ("str", "bytes", "datetime", "date"):
        if not isinstance(data, str):
            raise SchemaError(f"{path}: expected a string, got {data!r}")
        return data
    if type_name == "int":
        if isinstance(data, bool) or not isinstance(data, int):
            raise SchemaError(f"{path}: expected an integer, got {data!r}")
        return data
    if type_name == "float":
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise SchemaError(f"{path}: expected a number, got {data!r}")
        return data
    if type_name == "bool":
        if not isinstance(data, bool):
            raise SchemaError(f"{path}: expected true or false, got {data!r}")
        return data
    klass = getattr(client.models, type_name)
    if not isinstance(data, dict):
        raise SchemaError(f"{path}: expected a {type_name} object, got {data!r}")
    by_json = {json_key: attr for attr, json_key in klass.attribute_map.items()}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        attr = by_json.get(key)
        if attr is None:
            raise SchemaError(f"{path}: unknown field {key!r} for {type_name}")
        kwargs[attr] = _strict(value, klass.openapi_types[attr], f"{path}.{key}")
    try:
        return klass(**kwargs)
    except ValueError as exc:  # a required field is missing or an enum value is wrong
        raise SchemaError(f"{path}: {exc}") from None


def validate(obj: dict[str, Any]) -> Any:
    """The typed model of one manifest, or SchemaError saying where it is wrong."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in MODELS:
        raise SchemaError(f"no API model for apiVersion/kind {key}")
    model = _strict(obj, MODELS[key], str(obj.get("kind")))  # type: ignore[arg-type]
    _check_names(obj)
    return model


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _check_names(obj: dict[str, Any]) -> None:
    name = (obj.get("metadata") or {}).get("name", "")
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise SchemaError(f"{obj['kind']}: name {name!r} is not a DNS label")


SERVICE_MONITOR_ENDPOINT_KEYS = {
    "port",
    "targetPort",
    "path",
    "scheme",
    "interval",
    "scrapeTimeout",
    "honorLabels",
    "relabelings",
    "metricRelabelings",
}


def validate_service_monitor(obj: dict[str, Any]) -> None:
    """monitoring.coreos.com/v1 ServiceMonitor: a CRD the client has no model for."""
    if set(obj) - {"apiVersion", "kind", "metadata", "spec"}:
        raise SchemaError(f"ServiceMonitor: unknown top-level fields {set(obj)}")
    _strict(obj["metadata"], "V1ObjectMeta", "ServiceMonitor.metadata")
    _check_names(obj)
    spec = obj["spec"]
    if set(spec) - {"selector", "namespaceSelector", "endpoints", "jobLabel"}:
        raise SchemaError(f"ServiceMonitor.spec: unknown fields {set(spec)}")
    _strict(spec["selector"], "V1LabelSelector", "ServiceMonitor.spec.selector")
    names = spec.get("namespaceSelector", {})
    if set(names) - {"matchNames", "any"} or not all(
        isinstance(n, str) for n in names.get("matchNames", [])
    ):
        raise SchemaError(f"ServiceMonitor.spec.namespaceSelector: bad {names}")
    endpoints = spec["endpoints"]
    if not isinstance(endpoints, list) or not endpoints:
        raise SchemaError("ServiceMonitor.spec.endpoints must be a non-empty list")
    for endpoint in endpoints:
        if set(endpoint) - SERVICE_MONITOR_ENDPOINT_KEYS:
            raise SchemaError(f"ServiceMonitor endpoint: unknown fields {set(endpoint)}")
        for key in ("port", "path", "interval", "scrapeTimeout"):
            if key in endpoint and not isinstance(endpoint[key], str):
                raise SchemaError(f"ServiceMonitor endpoint {key} must be a string")
