"""The Grafana dashboard (deploy/grafana/hiveroute.json), written from this one description.

`python -m hiveroute.observability.grafana > deploy/grafana/hiveroute.json` regenerates it; a test
checks the file matches and that every query returns data from a real Prometheus. Panels read
the router's own `hiveroute_*` series (filtered by `engine`) and the engines' `vllm:*` series
(filtered by `instance`, which is the engine's host:port, as the router names engines).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
ENG = 'engine=~"$engine"'
INST = 'instance=~"$engine"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    description: str = ""
    width: int = 8
    max: float | None = None


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def q(expr: str, legend: str = "") -> Query:
    return Query(expr, legend)


def quantiles(
    metric: str, by: str, selector: str, qs: tuple[float, ...] = (0.5, 0.95)
) -> tuple[Query, ...]:
    """p50/p95 of a histogram, per `by` label ("" for one series)."""
    group = f"le, {by}" if by else "le"
    legend = f"{{{{{by}}}}} " if by else ""
    sel = f"{{{selector}}}" if selector else ""
    return tuple(
        q(
            f"histogram_quantile({p}, sum by ({group}) (rate({metric}_bucket{sel}[{RATE}])))",
            f"{legend}p{round(p * 100)}",
        )
        for p in qs
    )


def ratio(num: str, den: str, by: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({num}[{RATE}])) / sum{group} (rate({den}[{RATE}]))"


ROWS: tuple[Row, ...] = (
    Row(
        "Overview",
        (
            Panel(
                "Requests per second",
                (q(f"sum(rate(hiveroute_requests_total{{{ENG}}}[{RATE}]))", "requests/s"),),
                unit="reqps",
                kind="stat",
                width=4,
            ),
            Panel(
                "Prefix-cache hit rate (router)",
                (
                    q(
                        ratio(
                            f"hiveroute_cached_tokens_total{{{ENG}}}",
                            f"hiveroute_prompt_tokens_total{{{ENG}}}",
                        ),
                        "hit rate",
                    ),
                ),
                unit="percentunit",
                kind="stat",
                width=4,
                description="Cached prompt tokens over prompt tokens, from the engines' usage.",
            ),
            Panel(
                "Cross-agent hit rate",
                (
                    q(
                        ratio(
                            f"hiveroute_cross_agent_cached_tokens_total{{{ENG}}}",
                            f"hiveroute_prompt_tokens_total{{{ENG}}}",
                        ),
                        "cross-agent",
                    ),
                ),
                unit="percentunit",
                kind="stat",
                width=4,
                description="Prompt tokens served from blocks another agent of the same workflow "
                "computed, over all prompt tokens.",
            ),
            Panel(
                "Healthy engines",
                (q(f"sum(hiveroute_engine_up{{{ENG}}})", "up"),),
                kind="stat",
                width=4,
            ),
            Panel(
                "In flight",
                (q(f"sum(hiveroute_in_flight_requests{{{ENG}}})", "in flight"),),
                kind="stat",
                width=4,
            ),
            Panel(
                "Workflow TTFT p95",
                (
                    q(
                        "histogram_quantile(0.95, sum by (le) "
                        f"(rate(hiveroute_workflow_ttft_seconds_bucket[{RATE}])))",
                        "p95",
                    ),
                ),
                unit="s",
                kind="stat",
                width=4,
            ),
        ),
    ),
    Row(
        "Latency at the router",
        (
            Panel(
                "Time to first token",
                quantiles("hiveroute_ttft_seconds", "engine", ENG),
                unit="s",
            ),
            Panel(
                "Inter-token latency (TBT)",
                quantiles("hiveroute_inter_token_latency_seconds", "engine", ENG),
                unit="s",
                description="Mean gap between a stream's data events, one observation a request.",
            ),
            Panel(
                "End-to-end latency",
                quantiles("hiveroute_e2e_latency_seconds", "engine", ENG),
                unit="s",
            ),
            Panel(
                "Router overhead",
                quantiles("hiveroute_router_overhead_seconds", "policy", "", (0.5, 0.99)),
                unit="s",
                description="Parsing and routing before the request leaves for an engine.",
            ),
            Panel(
                "Router event-loop lag",
                quantiles("hiveroute_event_loop_lag_seconds", "", "", (0.5, 0.99)),
                unit="s",
                description="How late a worker's event loop ran a timer: the wait a request "
                "meets before the router reads it. A p99 near the TTFT budget asks for more "
                "workers or cores.",
            ),
            Panel(
                "TTFT by agent role (p95)",
                quantiles("hiveroute_agent_ttft_seconds", "role", "", (0.95,)),
                unit="s",
            ),
            Panel(
                "Requests by status",
                (
                    q(
                        f"sum by (status) (rate(hiveroute_requests_total{{{ENG}}}[{RATE}]))",
                        "{{status}}",
                    ),
                ),
                unit="reqps",
            ),
        ),
    ),
    Row(
        "Cache",
        (
            Panel(
                "Hit rate by engine",
                (
                    q(
                        ratio(
                            f"hiveroute_cached_tokens_total{{{ENG}}}",
                            f"hiveroute_prompt_tokens_total{{{ENG}}}",
                            "engine",
                        ),
                        "{{engine}}",
                    ),
                ),
                unit="percentunit",
                max=1,
            ),
            Panel(
                "Tokens per second",
                (
                    q(f"sum(rate(hiveroute_prompt_tokens_total{{{ENG}}}[{RATE}]))", "prompt"),
                    q(f"sum(rate(hiveroute_cached_tokens_total{{{ENG}}}[{RATE}]))", "cached"),
                    q(
                        f"sum(rate(hiveroute_cross_agent_cached_tokens_total{{{ENG}}}[{RATE}]))",
                        "cross-agent cached",
                    ),
                    q(
                        f"sum(rate(hiveroute_completion_tokens_total{{{ENG}}}[{RATE}]))",
                        "generated",
                    ),
                ),
                unit="short",
                description="Tokens per second.",
            ),
            Panel(
                "Hit rate by agent role",
                (
                    q(
                        ratio(
                            "hiveroute_agent_cached_tokens_total",
                            "hiveroute_agent_prompt_tokens_total",
                            "role",
                        ),
                        "{{role}}",
                    ),
                ),
                unit="percentunit",
                max=1,
            ),
        ),
    ),
    Row(
        "Workflows",
        (
            Panel(
                "Workflow TTFT",
                quantiles("hiveroute_workflow_ttft_seconds", "", ""),
                unit="s",
                description="A workflow's first request arriving to its first token.",
            ),
            Panel(
                "Workflow completion time",
                quantiles("hiveroute_workflow_completion_seconds", "", ""),
                unit="s",
            ),
            Panel(
                "Hand-off latency",
                quantiles("hiveroute_handoff_latency_seconds", "", ""),
                unit="s",
                description="One agent's response ending to the next agent's request.",
            ),
            Panel(
                "Requests by agent role",
                (
                    q(
                        f"sum by (role) (rate(hiveroute_agent_requests_total[{RATE}]))",
                        "{{role}}",
                    ),
                ),
                unit="reqps",
            ),
        ),
    ),
    Row(
        "Routing",
        (
            Panel(
                "Decisions by reason",
                (
                    q(
                        "sum by (policy, reason) "
                        f"(rate(hiveroute_routing_decisions_total[{RATE}]))",
                        "{{policy}} {{reason}}",
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Retries and rejections",
                (
                    q(
                        f"sum by (engine) (rate(hiveroute_retries_total{{{ENG}}}[{RATE}]))",
                        "retried away from {{engine}}",
                    ),
                    q(
                        f"sum by (reason) (rate(hiveroute_rejected_requests_total[{RATE}]))",
                        "rejected: {{reason}}",
                    ),
                ),
                unit="reqps",
            ),
            Panel(
                "Requests by engine",
                (
                    q(
                        f"sum by (engine) (rate(hiveroute_requests_total{{{ENG}}}[{RATE}]))",
                        "{{engine}}",
                    ),
                ),
                unit="reqps",
            ),
        ),
    ),
    Row(
        "Engines as the router sees them",
        (
            Panel("Engine up", (q(f"hiveroute_engine_up{{{ENG}}}", "{{engine}}"),), max=1),
            Panel(
                "Queue depth",
                (q(f"hiveroute_engine_queue_depth{{{ENG}}}", "{{engine}}"),),
                description="The router's in-flight count plus others' requests the engine "
                "reported at its last scrape.",
            ),
            Panel(
                "KV-cache usage",
                (q(f"hiveroute_engine_kv_usage_ratio{{{ENG}}}", "{{engine}}"),),
                unit="percentunit",
                max=1,
            ),
        ),
    ),
    Row(
        "KV index",
        (
            Panel(
                "Blocks indexed",
                (
                    q("sum(hiveroute_kv_index_blocks)", "all block keys"),
                    q(f"hiveroute_kv_index_engine_blocks{{{ENG}}}", "{{engine}}"),
                ),
            ),
            Panel(
                "KV events applied",
                (
                    q(
                        f"sum by (engine) (rate(hiveroute_kv_events_total{{{ENG}}}[{RATE}]))",
                        "{{engine}}",
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "KV-event lag",
                (q(f"max by (engine) (hiveroute_kv_event_lag_seconds{{{ENG}}})", "{{engine}}"),),
                unit="s",
                description="From an engine stamping its latest KV-event batch to the router "
                "applying it; clock skew between hosts adds to it.",
            ),
            Panel(
                "KV events stale (served, no events)",
                (q(f"max by (engine) (hiveroute_kv_events_stale{{{ENG}}})", "{{engine}}"),),
                max=1,
                description="1 while an engine that served requests has sent no KV event for "
                "10 s: a wrong events= address or a firewall; KV-aware routing cannot see its "
                "cache until events arrive.",
            ),
            Panel(
                "KV-event gaps, restarts, decode errors, evictions",
                (
                    q(
                        f"sum by (engine, outcome) (increase(hiveroute_kv_event_gaps_total{{{ENG}}}[{RATE}]))",
                        "gap {{outcome}} {{engine}}",
                    ),
                    q(
                        f"sum by (engine) (increase(hiveroute_kv_publisher_restarts_total{{{ENG}}}[{RATE}]))",
                        "restart {{engine}}",
                    ),
                    q(
                        f"sum by (engine) (increase(hiveroute_kv_event_decode_errors_total{{{ENG}}}[{RATE}]))",
                        "decode error {{engine}}",
                    ),
                    q(
                        f"sum(increase(hiveroute_kv_index_evictions_total[{RATE}]))",
                        "index evictions (LRU)",
                    ),
                ),
            ),
        ),
    ),
    Row(
        "vLLM engines (their own metrics)",
        (
            Panel(
                "Requests running",
                (q(f"sum by (instance) (vllm:num_requests_running{{{INST}}})", "{{instance}}"),),
            ),
            Panel(
                "Requests waiting",
                (q(f"sum by (instance) (vllm:num_requests_waiting{{{INST}}})", "{{instance}}"),),
            ),
            Panel(
                "KV-cache usage (vLLM)",
                (q(f"max by (instance) (vllm:kv_cache_usage_perc{{{INST}}})", "{{instance}}"),),
                unit="percentunit",
                max=1,
            ),
            Panel(
                "Prefix-cache hit rate (vLLM)",
                (
                    q(
                        ratio(
                            f"vllm:prefix_cache_hits_total{{{INST}}}",
                            f"vllm:prefix_cache_queries_total{{{INST}}}",
                            "instance",
                        ),
                        "{{instance}}",
                    ),
                ),
                unit="percentunit",
                max=1,
            ),
            Panel(
                "Time to first token (vLLM)",
                quantiles("vllm:time_to_first_token_seconds", "instance", INST),
                unit="s",
            ),
            Panel(
                "Inter-token latency (vLLM)",
                quantiles("vllm:inter_token_latency_seconds", "instance", INST),
                unit="s",
            ),
            Panel(
                "End-to-end latency (vLLM)",
                quantiles("vllm:e2e_request_latency_seconds", "instance", INST),
                unit="s",
            ),
        ),
    ),
    Row(
        "Shared state (Redis across replicas)",
        (
            Panel(
                "State backend up",
                (q("min by (instance, backend) (hiveroute_state_backend_up)", "{{instance}}"),),
                description="1 while the state backend answers; 0 while a replica serves on "
                "its local state (Redis unreachable)",
                max=1,
            ),
            Panel(
                "State backend failures and local operations",
                (
                    q(
                        f"sum by (reason) (rate(hiveroute_state_errors_total[{RATE}])) "
                        "or vector(0)",
                        "failed: {{reason}}",
                    ),
                    q(
                        f"sum(rate(hiveroute_state_local_operations_total[{RATE}])) or vector(0)",
                        "served locally",
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Keys reconciled after an outage",
                (
                    q(
                        f"sum by (result) (increase(hiveroute_state_reconciled_keys_total[{RATE}]))"
                        " or vector(0)",
                        "{{result}}",
                    ),
                ),
            ),
        ),
    ),
)


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    height = 4 if panel.kind == "stat" else 8
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.max is not None:
        defaults["max"] = panel.max
        defaults["min"] = 0
    options: dict[str, Any]
    if panel.kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        }
    else:
        defaults["custom"] = {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
        options = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": query.expr,
                "legendFormat": query.legend,
                "range": True,
            }
            for i, query in enumerate(panel.queries)
        ],
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    panel_id = 1
    y = 0
    for row in ROWS:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id += 1
        y += 1
        x = 0
        row_height = 0
        for panel in row.panels:
            if x + panel.width > 24:
                x = 0
                y += row_height
                row_height = 0
            item = _panel_json(panel, panel_id, x, y)
            panels.append(item)
            panel_id += 1
            x += panel.width
            row_height = max(row_height, item["gridPos"]["h"])
        y += row_height
    return {
        "uid": "hiveroute",
        "title": "hiveroute",
        "description": "hiveroute router: latency, cache, workflows, routing, KV index, and the "
        "vLLM engines behind it",
        "tags": ["hiveroute", "vllm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                {
                    "name": "engine",
                    "label": "Engine",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "definition": "label_values(hiveroute_engine_up, engine)",
                    "query": {
                        "query": "label_values(hiveroute_engine_up, engine)",
                        "refId": "engines",
                    },
                    "refresh": 2,
                    "includeAll": True,
                    "allValue": ".*",
                    "multi": True,
                    "current": {"text": "All", "value": "$__all"},
                    "sort": 1,
                    "hide": 0,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
