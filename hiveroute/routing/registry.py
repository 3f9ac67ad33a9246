"""Building policies by name or from YAML.

Every policy, built-in or user-defined, is a spec: a list of filters, weighted scorers and a
picker, each named with its parameters. Built-in policies are specs like any other, so a user
can copy one into the config file and change a weight:

    policies:
      sticky_but_fair:
        scorers:
          - {name: session_affinity, weight: 1.0, load_factor: 1.1}
          - {name: load, weight: 0.05}
        picker: max_score
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hiveroute.engines.pool import EnginePool
from hiveroute.errors import ConfigError
from hiveroute.kvindex.index import KvIndex
from hiveroute.kvindex.tokenizer import Tokenizer, load_tokenizer
from hiveroute.routing.base import Filter, Picker, Plugin, Scorer
from hiveroute.routing.cache_aware import ApproxPrefixScorer, KvTtftScorer, LoadGuardFilter
from hiveroute.routing.costs import CostModel
from hiveroute.routing.pickers import MaxScorePicker, RoundRobinPicker
from hiveroute.routing.policy import Policy, WeightedScorer
from hiveroute.routing.scorers import LoadScorer, SessionAffinityScorer


@dataclass
class PluginContext:
    """What plugin factories may use: the router's shared parts, typed.

    Each has a default, so a test can build one scorer, or a whole policy, from a pool alone."""

    pool: EnginePool
    tokenizer: Tokenizer = field(default_factory=lambda: load_tokenizer(None))
    kv_index: KvIndex = field(default_factory=KvIndex)
    costs: CostModel = field(default_factory=CostModel)


T = TypeVar("T")
PluginFactory = Callable[..., Plugin]  # (ctx: PluginContext, **params) -> Plugin


def _kv_ttft(ctx: PluginContext, drain_backlog: bool = True, **kw: Any) -> Plugin:
    ledger = ctx.costs.ledger(drain_backlog=drain_backlog)
    cost = ctx.costs.routing_cost(ctx.kv_index, ledger)
    return KvTtftScorer(ctx.kv_index, ctx.tokenizer, cost, **kw)


BUILTIN_PLUGINS: dict[str, PluginFactory] = {
    "round_robin": lambda ctx: RoundRobinPicker(),
    "max_score": lambda ctx: MaxScorePicker(),
    "load": lambda ctx: LoadScorer(),
    "session_affinity": lambda ctx, **kw: SessionAffinityScorer(**kw),
    "load_guard": lambda ctx, **kw: LoadGuardFilter(**kw),
    "kv_ttft": _kv_ttft,
    "prefix_affinity": lambda ctx, **kw: ApproxPrefixScorer(ctx.tokenizer, **kw),
}


class PluginRegistry:
    """Plugin factories by name: the built-in ones, and any other part's (`register`).

    One registry per router (no global one): the assembly registers `workflow_placement`, whose
    factory holds the router's workflow service, so routing never imports workflows."""

    def __init__(self, factories: Mapping[str, PluginFactory] | None = None) -> None:
        self._factories: dict[str, PluginFactory] = dict(
            BUILTIN_PLUGINS if factories is None else factories
        )

    def register(self, name: str, factory: PluginFactory) -> None:
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def get(self, name: str) -> PluginFactory | None:
        return self._factories.get(name)


BUILTIN_POLICIES: dict[str, dict[str, Any]] = {
    "round_robin": {"picker": "round_robin", "default_reason": "round_robin"},
    "least_load": {
        "scorers": [{"name": "load"}],
        "picker": "max_score",
        "default_reason": "least_load",
    },
    "session": {
        "scorers": [
            {"name": "session_affinity", "weight": 1.0},
            {"name": "load", "weight": 0.01},
        ],
        "picker": "max_score",
    },
    "prefix": {
        "filters": [{"name": "load_guard"}],
        "scorers": [
            {"name": "prefix_affinity", "weight": 1.0},
            {"name": "load", "weight": 0.1},
        ],
        "picker": "max_score",
    },
    "kv": {
        # no load guard: the cost (routing/cost.py) already weighs each engine's load
        "scorers": [{"name": "kv_ttft", "weight": 1.0}],
        "picker": "max_score",
    },
    "workflow": {
        "scorers": [{"name": "workflow_placement", "weight": 1.0}],
        "picker": "max_score",
    },
}


def _build_plugin(spec: Any, ctx: PluginContext, where: str, plugins: PluginRegistry) -> Plugin:
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
        raise ConfigError(f"{where}: expected a plugin name or {{name: ..., ...}}, got {spec!r}")
    params = {k: v for k, v in spec.items() if k not in ("name", "weight")}
    factory = plugins.get(spec["name"])
    if factory is None:
        raise ConfigError(
            f"{where}: unknown plugin {spec['name']!r}; known: {', '.join(plugins.names())}"
        )
    try:
        return factory(ctx, **params)
    except ValueError as exc:
        raise ConfigError(f"{where}: plugin {spec['name']!r}: {exc}") from None
    except TypeError as exc:
        # "<lambda>() got an unexpected keyword argument 'x'": the function named is ours
        reason = re.sub(r"^[\w.<>]+\(\) ", "", str(exc))
        raise ConfigError(
            f"{where}: bad parameters for plugin {spec['name']!r}: {reason}"
        ) from None


def build_policy(
    name: str,
    ctx: PluginContext,
    custom: Mapping[str, Mapping[str, Any]] | None = None,
    plugins: PluginRegistry | None = None,
) -> Policy:
    """Build policy `name` from the user's specs first, then the built-ins."""
    plugins = plugins or PluginRegistry()
    specs = {**BUILTIN_POLICIES, **(custom or {})}
    spec = specs.get(name)
    if spec is None:
        raise ConfigError(f"unknown policy {name!r}; choose one of {', '.join(sorted(specs))}")
    where = f"policy {name!r}"
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected {{filters: [...], scorers: [...], picker: ...}}")
    for part in ("filters", "scorers"):
        if not isinstance(spec.get(part, []), list):
            raise ConfigError(f"{where}: {part} must be a list of plugins")
    filters = [_build_plugin(s, ctx, f"{where} filters", plugins) for s in spec.get("filters", [])]
    scorers: list[WeightedScorer] = []
    for s in spec.get("scorers", []):
        weight = _weight(s.get("weight", 1.0), where) if isinstance(s, Mapping) else 1.0
        scorers.append(
            WeightedScorer(
                _check(_build_plugin(s, ctx, f"{where} scorers", plugins), Scorer, where), weight
            )
        )
    picker = _check(
        _build_plugin(spec.get("picker", "max_score"), ctx, f"{where} picker", plugins),
        Picker,
        where,
    )
    return Policy(
        name,
        filters=[_check(f, Filter, where) for f in filters],
        scorers=scorers,
        picker=picker,
        default_reason=str(spec.get("default_reason", "best_score")),
    )


def _weight(value: Any, where: str) -> float:
    """A scorer's weight: a finite number, not below zero."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ConfigError(f"{where} scorers: a weight must be a number >= 0, got {value!r}")
    return float(value)


def _check(plugin: Plugin, kind: type[T], where: str) -> T:
    if not isinstance(plugin, kind):
        raise ConfigError(f"{where}: plugin {plugin.name!r} is not a {kind.__name__}")
    return plugin


def policy_names(custom: Mapping[str, Any] | None = None) -> list[str]:
    return sorted({*BUILTIN_POLICIES, *(custom or {})})
