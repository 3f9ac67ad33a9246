"""Router configuration: one YAML file, every key also a CLI flag and a HIVEROUTE_* variable.

Precedence, highest first: command-line flag, environment variable, YAML file, default. A key
``max_body_bytes`` is the flag ``--max-body-bytes`` and the variable
``HIVEROUTE_MAX_BODY_BYTES``. List-valued keys take a comma-separated variable and repeated
flags; mapping-valued keys take JSON on the command line and in the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import socket
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from hiveroute.errors import ConfigError
from hiveroute.runtime import available_cores

# Agent roles seen in practice; any other role is counted as "other", a missing one as "none".
DEFAULT_ROLES = (
    "planner",
    "executor",
    "worker",
    "researcher",
    "coder",
    "tool",
    "critic",
    "reviewer",
    "validator",
    "summarizer",
    "orchestrator",
)
MAX_ROLES = 64


@dataclass(frozen=True)
class EngineSpec:
    """How to reach one engine: its HTTP base URL and, optionally, its KV-event endpoints."""

    url: str
    events: str | None = None
    replay: str | None = None

    @classmethod
    def parse(cls, text: str) -> EngineSpec:
        """Parse ``URL[,events=tcp://H:P][,replay=tcp://H:P]`` as given to ``--engine``."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise ConfigError("empty --engine value; expected URL[,events=tcp://HOST:PORT]")
        url = parts[0].rstrip("/")
        split = urlsplit(url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ConfigError(f"engine URL {url!r} must look like http://HOST:PORT")
        options: dict[str, str] = {}
        for part in parts[1:]:
            key, sep, value = part.partition("=")
            if not sep or key not in ("events", "replay"):
                raise ConfigError(
                    f"unknown engine option {part!r} in {text!r}; use events=tcp://HOST:PORT "
                    "or replay=tcp://HOST:PORT"
                )
            if not value.startswith("tcp://"):
                raise ConfigError(f"engine option {key} must be a tcp:// endpoint, got {value!r}")
            options[key] = value
        return cls(url=url, events=options.get("events"), replay=options.get("replay"))

    @cached_property
    def name(self) -> str:
        """A short stable name (``host:port``), used as the ``engine`` metric label."""
        split = urlsplit(self.url)
        port = split.port or (443 if split.scheme == "https" else 80)
        return f"{split.hostname}:{port}"


def otlp_traces_url(endpoint: str) -> str:
    """Accept a collector's base URL (``http://host:4318``) or its full traces URL."""
    split = urlsplit(endpoint)
    if split.scheme not in ("http", "https") or not split.hostname:
        raise ConfigError(
            f"otlp_endpoint {endpoint!r} must be an http(s) URL such as http://localhost:4318"
        )
    if split.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


ENV_PREFIX = "HIVEROUTE_"


def _opt(help: str, default: Any = dataclasses.MISSING, **extra: Any) -> Any:
    meta = {"help": help, **extra}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)  # type: ignore[misc]
    return field(default=default, metadata=meta)


MAX_WORKERS = 8  # `workers` beyond this gain little: the engines, not the router, are the limit


def default_workers() -> int:
    """One router process per core the router may use, at most MAX_WORKERS: one Python process
    uses one core, and requests on agentic traffic cost the router about a millisecond each.
    Without SO_REUSEPORT (Windows) workers cannot share a port: one."""
    if not hasattr(socket, "SO_REUSEPORT"):
        return 1
    return min(available_cores(), MAX_WORKERS)


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")  # what --log-level accepts


@dataclass
class RouterConfig:
    host: str = _opt("address to listen on", "0.0.0.0")
    port: int = _opt("port to listen on", 8080)
    workers: int = field(
        default_factory=default_workers,
        metadata={
            "help": f"router processes serving the port (SO_REUSEPORT), sharing state, 1.."
            f"{MAX_WORKERS}; default: one per core this process may use (its CPU affinity and "
            f"cgroup quota), at most {MAX_WORKERS}"
        },
    )
    engine: list[str] = _opt(
        "engine URL, optionally with ',events=tcp://HOST:PORT'; repeat for several. "
        "None: start embedded simulated engines",
        [],
    )
    embedded_engines: int = _opt("how many simulated engines to embed when no engine is given", 2)
    policy: str = _opt("routing policy name", "workflow")
    policies: dict[str, Any] = _opt("custom policy specs (YAML mapping; JSON on the CLI)", {})
    tokenizer: str | None = _opt(
        "directory with the model's tokenizer.json (and chat template), so cache-aware routing "
        "sees the engines' token ids; default: the built-in tokenizer (the simulator's)",
        None,
    )
    kv_index_max_blocks: int = _opt("most block keys the KV index keeps (LRU beyond)", 500_000)
    kv_speculative_ttl_s: float = _opt(
        "seconds a routed request's blocks count as cached before KV events confirm them", 5.0
    )
    kv_events_topic: str = _opt("ZMQ topic prefix of the engines' KV events ('' = all)", "")
    log_level: str = _opt("log level: debug, info, warning, error", "info")
    max_body_bytes: int = _opt("largest request body accepted, in bytes", 32 * 1024 * 1024)
    health_interval_s: float = _opt("seconds between engine health checks", 2.0)
    connect_timeout_s: float = _opt("seconds to connect to an engine before trying another", 2.0)
    first_byte_timeout_s: float = _opt(
        "seconds a streamed request may wait for its first byte before it is retried elsewhere",
        60.0,
    )
    request_timeout_s: float = _opt("seconds a whole request may take", 600.0)
    retries: int = _opt("retries on another engine when one cannot be reached", 1)
    max_in_flight: int = _opt("requests the router serves at once; more wait in the queue", 4096)
    admission_queue_depth: int = _opt("requests that may wait for a slot; more get 429", 4096)
    admission_timeout_s: float = _opt("seconds a request may wait for a slot before 429", 30.0)
    api_keys: dict[str, Any] = _opt(
        "client API keys, mapping key to tenant (JSON on the CLI); none: no client auth", {}
    )
    api_keys_file: str | None = _opt("YAML or JSON file mapping client API keys to tenants", None)
    admin_key: str | None = _opt("key for the control API and /dashboard across tenants", None)
    salt_secret: str | None = _opt(
        "secret from which per-tenant cache_salt values are derived (random if unset; set it "
        "on every replica so they agree)",
        None,
    )
    engine_api_key: str | None = _opt("API key the router sends to engines", None)
    discovery: str = _opt(
        "how engines are found: 'static' (the engine list) or 'kubernetes' (pods by label)",
        "static",
    )
    k8s_namespace: str = _opt(
        "Kubernetes namespace to find engine pods in (empty: the router's own namespace)", ""
    )
    k8s_label_selector: str = _opt(
        "label selector of engine pods, e.g. 'app.kubernetes.io/component=engine'",
        "hiveroute.io/role=engine",
    )
    k8s_port: int = _opt("engine pods' HTTP port", 8000)
    k8s_scheme: str = _opt("engine pods' URL scheme: http or https", "http")
    k8s_events_port: int = _opt("engine pods' KV-event PUB port (0: no KV events)", 5557)
    k8s_replay_port: int = _opt("engine pods' KV-event replay port (0: no replay)", 0)
    k8s_kubeconfig: str = _opt(
        "kubeconfig file for discovery (empty: in-cluster service account, else ~/.kube/config)",
        "",
    )
    k8s_context: str = _opt("kubeconfig context to use (empty: the current one)", "")
    state: str = _opt(
        "where shared state lives: 'memory' or a redis:// (rediss://) URL shared by replicas",
        "memory",
    )
    workflow_ttl_s: float = _opt("seconds an idle workflow lives before it expires", 600.0)
    workflow_retain_s: float = _opt(
        "seconds an ended or expired workflow stays readable in the API", 3600.0
    )
    workflow_max_requests: int = _opt("requests kept per workflow in the API (most recent)", 256)
    workflow_max_agents: int = _opt("agents tracked per workflow (more count as '(other)')", 256)
    max_workflows: int = _opt("most workflows the router holds at once", 10_000)
    context_max_bytes: int = _opt("largest shared context accepted, in bytes", 4 * 1024 * 1024)
    context_max_count: int = _opt("most shared contexts the router holds", 1000)
    shared_prefix_layout: bool = _opt(
        "lay out every workflow's prompts shared contexts first (workflows may opt in alone)",
        False,
    )
    workflow_priorities: bool = _opt(
        "set vLLM 'priority' from each workflow's attained service (least first; engines need "
        "--scheduling-policy priority); workflows may opt in alone",
        False,
    )
    priority_quantum_tokens: int = _opt(
        "service (tokens) after which a workflow's priority level first drops", 2048
    )
    keep_warm_interval_s: float = _opt(
        "seconds between keep-warm rounds (0 turns keep-warm and pre-warm off)", 1.0
    )
    keep_warm_idle_s: float = _opt(
        "seconds a workflow's prefix may sit unused on an engine before it is re-touched", 2.0
    )
    keep_warm_max_rps: float = _opt("most keep-warm requests per second, all engines together", 4.0)
    keep_warm_retention_s: float = _opt(
        "seconds a retention hint asks an engine to keep a prefix (engines that support it)", 10.0
    )
    keep_warm_max_idle_s: float = _opt(
        "a workflow idle longer than this is no longer kept warm (it is probably done)", 30.0
    )
    keep_warm_max_kv_usage: float = _opt(
        "engines whose KV cache is fuller than this (0..1) get no retention pins, only touches", 0.8
    )
    metrics_roles: list[str] = _opt(
        "agent roles that get their own value of the metrics' role label; others count as 'other'",
        list(DEFAULT_ROLES),
    )
    otlp_endpoint: str | None = _opt(
        "OTLP/HTTP collector URL for request traces, e.g. http://localhost:4318; none: tracing off",
        None,
    )
    otlp_service_name: str = _opt("service.name of the router's spans", "hiveroute")
    otlp_sample_ratio: float = _opt(
        "share of traces sampled when the caller did not decide (0..1)", 1.0
    )
    otlp_headers: dict[str, Any] = _opt(
        "extra headers for the OTLP exporter, e.g. an API key (JSON on the CLI)", {}
    )

    def client_api_keys(self) -> dict[str, str]:
        """Client keys (key -> tenant) from `api_keys` and `api_keys_file` together."""
        keys = {str(k): str(v) for k, v in self.api_keys.items()}
        if self.api_keys_file:
            try:
                loaded = yaml.safe_load(Path(self.api_keys_file).read_text()) or {}
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
                raise ConfigError(
                    f"cannot read api_keys_file {self.api_keys_file}: {exc}"
                ) from None
            if not isinstance(loaded, dict):
                raise ConfigError(f"api_keys_file {self.api_keys_file} must map keys to tenants")
            keys.update({str(k): str(v) for k, v in loaded.items()})
        for key, tenant in keys.items():
            if len(key) < 8 or not tenant:
                raise ConfigError("every API key needs 8 or more characters and a tenant name")
        if self.admin_key is not None and len(self.admin_key) < 8:
            raise ConfigError("admin_key needs 8 or more characters, as client keys do")
        if self.admin_key is not None and self.admin_key in keys:
            raise ConfigError("the admin key must differ from every client key")
        return keys

    @property
    def engine_specs(self) -> list[EngineSpec]:
        return [EngineSpec.parse(text) for text in self.engine]

    def validate(self) -> RouterConfig:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0..65535, got {self.port}")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError(
                f"workers must be 1..{MAX_WORKERS} (router processes on this host), "
                f"got {self.workers}"
            )
        if self.max_body_bytes <= 0:
            raise ConfigError("max_body_bytes must be positive")
        if self.log_level.lower() not in LOG_LEVELS:
            raise ConfigError(f"unknown log level {self.log_level!r}")
        if self.retries < 0:
            raise ConfigError("retries must be 0 or more")
        if self.max_in_flight <= 0 or self.admission_queue_depth < 0:
            raise ConfigError("max_in_flight must be positive and admission_queue_depth 0 or more")
        if self.admission_timeout_s <= 0:
            raise ConfigError("admission_timeout_s must be positive")
        if len(self.metrics_roles) > MAX_ROLES:
            raise ConfigError(f"metrics_roles may list at most {MAX_ROLES} roles")
        if not 0.0 <= self.otlp_sample_ratio <= 1.0:
            raise ConfigError("otlp_sample_ratio must be between 0 and 1")
        if self.otlp_endpoint:
            otlp_traces_url(self.otlp_endpoint)  # raises ConfigError on a malformed URL
        self.client_api_keys()  # loads and checks the key file
        if self.discovery not in ("static", "kubernetes"):
            raise ConfigError(f"discovery must be 'static' or 'kubernetes', got {self.discovery!r}")
        if self.discovery == "kubernetes" and not self.k8s_label_selector.strip():
            raise ConfigError(
                "k8s_label_selector must not be empty with kubernetes discovery "
                "(it would match every pod in the namespace)"
            )
        for name in ("k8s_port", "k8s_events_port", "k8s_replay_port"):
            value = getattr(self, name)
            low = 1 if name == "k8s_port" else 0
            if not low <= value <= 65535:
                raise ConfigError(f"{name} must be {low}..65535, got {value}")
        if self.k8s_scheme not in ("http", "https"):
            raise ConfigError(f"k8s_scheme must be 'http' or 'https', got {self.k8s_scheme!r}")
        if self.state != "memory":
            split = urlsplit(self.state)
            if split.scheme not in ("redis", "rediss") or not split.hostname:
                raise ConfigError(
                    f"state must be 'memory' or a redis://HOST[:PORT][/DB] URL, got {self.state!r}"
                )
        for name, value in vars(self).items():  # NaN passes every < and <= check below
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value}")
        if self.embedded_engines < 1:
            raise ConfigError(
                "embedded_engines must be at least 1 (simulated engines started when no engine "
                "is given)"
            )
        if self.kv_index_max_blocks <= 0:
            raise ConfigError("kv_index_max_blocks must be positive")
        if self.kv_speculative_ttl_s < 0:
            raise ConfigError("kv_speculative_ttl_s must be 0 or more")
        if (
            self.tokenizer not in (None, "", "builtin")
            and not Path(str(self.tokenizer), "tokenizer.json").is_file()
        ):
            raise ConfigError(
                f"tokenizer: no tokenizer.json in {self.tokenizer!r}; give the model's directory"
            )
        for name in (
            "health_interval_s",
            "connect_timeout_s",
            "first_byte_timeout_s",
            "request_timeout_s",
            "workflow_ttl_s",
            "workflow_retain_s",
            "keep_warm_retention_s",
            "keep_warm_max_idle_s",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        for name in (
            "workflow_max_requests",
            "workflow_max_agents",
            "max_workflows",
            "context_max_bytes",
            "context_max_count",
            "priority_quantum_tokens",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be a positive integer")
        for name in ("keep_warm_interval_s", "keep_warm_idle_s", "keep_warm_max_rps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 or more")
        if not 0 < self.keep_warm_max_kv_usage <= 1:
            raise ConfigError("keep_warm_max_kv_usage must be in (0, 1]")
        self.engine_specs  # noqa: B018 - parses each spec, raising ConfigError on a bad one
        # the policy is checked by building it (assembly.check_config; the config is a leaf)
        return self


def _base_type(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])
    return origin or tp


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in (
        typing.get_args(tp)
    )


# engines given as one string: split before each URL, not at every comma (an engine's own
# options are comma-separated: http://a:8000,events=tcp://a:5557)
_BEFORE_A_URL = re.compile(r",\s*(?=[a-zA-Z][a-zA-Z0-9+.-]*://)")


def _coerce(name: str, value: Any, tp: Any, source: str) -> Any:
    base = _base_type(tp)
    if value is None:  # YAML's null (or ~): "not set" where a key may be unset
        if _optional(tp):
            return None
        raise ConfigError(f"{source}: {name} may not be null")
    try:
        if base is list:
            if isinstance(value, str):
                parts = _BEFORE_A_URL.split(value) if name == "engine" else value.split(",")
                return [v.strip() for v in parts if v.strip()]
            if not isinstance(value, list):
                raise TypeError("expected a list")
            return [str(v) for v in value]
        if base is dict:
            if isinstance(value, str):
                value = json.loads(value)
            if not isinstance(value, dict):
                raise TypeError("expected a mapping")
            return value
        if base is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if base is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        return base(value)
    except (TypeError, ValueError, json.JSONDecodeError) as exc:
        hint = ""
        if isinstance(value, str) and value.startswith("tcp://"):  # HIVEROUTE_PORT=tcp://...
            hint = (
                " (Kubernetes sets this for a Service named after the variable's prefix: "
                "set enableServiceLinks: false on the pod)"
            )
        raise ConfigError(f"{source}: bad value {value!r} for {name}: {exc}{hint}") from None


# The router's keys by the component that reads them, for `--help` and the README's reference
# (keys stay flat: every key, flag and HIVEROUTE_* variable is spelled as before).
CONFIG_GROUPS: dict[str, tuple[str, ...]] = {
    "listening": ("host", "port", "workers", "log_level", "max_body_bytes"),
    "engines": (
        "engine",
        "embedded_engines",
        "engine_api_key",
        "health_interval_s",
        "connect_timeout_s",
        "first_byte_timeout_s",
        "request_timeout_s",
        "retries",
    ),
    "discovery": (
        "discovery",
        "k8s_namespace",
        "k8s_label_selector",
        "k8s_port",
        "k8s_scheme",
        "k8s_events_port",
        "k8s_replay_port",
        "k8s_kubeconfig",
        "k8s_context",
    ),
    "routing": (
        "policy",
        "policies",
        "tokenizer",
        "kv_index_max_blocks",
        "kv_speculative_ttl_s",
        "kv_events_topic",
    ),
    "admission and auth": (
        "max_in_flight",
        "admission_queue_depth",
        "admission_timeout_s",
        "api_keys",
        "api_keys_file",
        "admin_key",
        "salt_secret",
    ),
    "workflows and state": (
        "state",
        "workflow_ttl_s",
        "workflow_retain_s",
        "workflow_max_requests",
        "workflow_max_agents",
        "max_workflows",
        "context_max_bytes",
        "context_max_count",
        "shared_prefix_layout",
        "workflow_priorities",
        "priority_quantum_tokens",
    ),
    "keep-warm": (
        "keep_warm_interval_s",
        "keep_warm_idle_s",
        "keep_warm_max_rps",
        "keep_warm_retention_s",
        "keep_warm_max_idle_s",
        "keep_warm_max_kv_usage",
    ),
    "observability": (
        "metrics_roles",
        "otlp_endpoint",
        "otlp_service_name",
        "otlp_sample_ratio",
        "otlp_headers",
    ),
}


def add_config_arguments(
    parser: argparse.ArgumentParser,
    cls: type = RouterConfig,
    notes: Mapping[str, str] | None = None,
) -> None:
    """One flag per config key; defaults are None so we can tell 'not given' from a default
    (the help shows the real one). `notes` adds to a key's help, e.g. the choices it takes.
    The router's flags are shown by component (CONFIG_GROUPS); other configs' in one list."""
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file")
    hints = typing.get_type_hints(cls)
    group_of: dict[str, Any] = {}
    if cls is RouterConfig:
        for title, keys in CONFIG_GROUPS.items():
            group = parser.add_argument_group(title)
            group_of.update(dict.fromkeys(keys, group))
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "default": None,
            "help": _help_with_default(f, (notes or {}).get(f.name)),
        }
        if _base_type(hints[f.name]) is list:
            kwargs["action"] = "append"
        group_of.get(f.name, parser).add_argument(flag, **kwargs)


def _help_with_default(f: dataclasses.Field[Any], note: str | None = None) -> str | None:
    """The field's help, a note, and its default (flags default to None to tell 'not given'
    apart, so argparse cannot show it)."""
    text = f.metadata.get("help")
    if text is None:
        return None
    if note:
        text = f"{text}: {note}"
    if "default" in text:  # the help already says it
        return str(text)
    if f.default is not dataclasses.MISSING:
        default: Any = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        return str(text)
    if default in (None, [], {}, ""):
        return f"{text} (default: none)"
    if isinstance(default, list):
        default = ",".join(str(v) for v in default)
    return f"{text} (default: {default})".replace("%", "%%")


def load_config(
    args: argparse.Namespace | Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cls: type = RouterConfig,
) -> Any:
    """Merge defaults, the YAML file, the environment and flags, in rising precedence."""
    env = os.environ if env is None else env
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}

    path = given.get("config") or env.get(ENV_PREFIX + "CONFIG")
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8 text: {exc.reason}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of keys to values")
        for key, value in loaded.items():
            name = str(key).replace("-", "_")
            if name == "engines":
                name = "engine"
            if name not in names:
                raise ConfigError(
                    f"config file {path}: unknown key {key!r}; known: {', '.join(sorted(names))}"
                )
            values[name] = _coerce(name, value, hints[name], f"config file {path}")

    for name in names:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(
                name, raw, hints[name], f"environment {ENV_PREFIX + name.upper()}"
            )

    for name in names:
        if given.get(name) is not None:
            values[name] = _coerce(
                name, given[name], hints[name], f"flag --{name.replace('_', '-')}"
            )

    config = cls(**values)
    validate = getattr(config, "validate", None)
    return validate() if validate else config
