"""A stand-in for the workflow API (WORKFLOW_API.md) for routers built without the registry.

It records real requests through the router's request hooks and answers `GET /v1/workflows`
and `GET /v1/workflows/{id}` in the contract's shape, so the dashboard can be tested against
live numbers. The real registry (hiveroute.workflows) replaces it where it is installed.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from hiveroute.errors import NotFound
from hiveroute.observability.metrics import RouterMetrics
from hiveroute.routing.base import RequestOutcome, RoutingRequest


class WorkflowStandIn:
    """Records workflows, answers the API, and observes the workflow metrics as the registry must:
    hand-off latency at each hand-off, workflow TTFT at its first token, completion time when the
    workflow is ended (DELETE)."""

    def __init__(self, metrics: RouterMetrics | None = None) -> None:
        self.workflows: dict[str, dict[str, Any]] = {}
        self.metrics = metrics

    async def before_route(self, request: RoutingRequest) -> None:
        meta = request.metadata
        if meta.workflow_id is None:
            return
        now = time.time()
        wf = self.workflows.setdefault(
            meta.workflow_id,
            {"id": meta.workflow_id, "created_at": now, "requests": [], "handoffs": []},
        )
        record = {
            "request_id": request.request_id,
            "agent_id": meta.agent_id,
            "agent_role": meta.agent_role,
            "stage": meta.stage,
            "parent_request_id": meta.parent_request_id,
            "engine": None,
            "started_at": now,
            "first_token_at": None,
            "ended_at": None,
            "ttft_s": None,
            "prompt_tokens": None,
            "cached_tokens": None,
            "cross_agent_cached_tokens": None,
            "status": "running",
        }
        # Hand-off: the latest response another agent finished before this request arrived.
        done = [
            r
            for r in wf["requests"]
            if r["ended_at"] is not None and r["agent_id"] != meta.agent_id
        ]
        if done:
            last = max(done, key=lambda r: r["ended_at"])
            wf["handoffs"].append(
                {
                    "from_agent": last["agent_id"],
                    "to_agent": meta.agent_id,
                    "from_request_id": last["request_id"],
                    "to_request_id": request.request_id,
                    "latency_s": now - last["ended_at"],
                }
            )
            if self.metrics is not None:
                self.metrics.handoff_latency.observe(now - last["ended_at"])
        wf["requests"].append(record)

    def after_complete(self, request: RoutingRequest, outcome: RequestOutcome) -> None:
        wf = self.workflows.get(request.metadata.workflow_id or "")
        if wf is None:
            return
        for record in wf["requests"]:
            if record["request_id"] == request.request_id:
                record["engine"] = outcome.engine.name
                record["ended_at"] = record["started_at"] + outcome.duration_s
                if outcome.ttft_s is not None:
                    first_yet = any(r["first_token_at"] is not None for r in wf["requests"])
                    record["ttft_s"] = outcome.ttft_s
                    record["first_token_at"] = record["started_at"] + outcome.ttft_s
                    if not first_yet and self.metrics is not None:
                        start = wf["requests"][0]["started_at"]
                        self.metrics.workflow_ttft.observe(record["first_token_at"] - start)
                record["prompt_tokens"] = outcome.prompt_tokens
                record["cached_tokens"] = outcome.cached_tokens
                record["cross_agent_cached_tokens"] = 0
                record["status"] = "ok" if outcome.ok else str(outcome.status)

    def detail(self, wf: dict[str, Any]) -> dict[str, Any]:
        requests = wf["requests"]
        agents: dict[str, dict[str, Any]] = {}
        engines: dict[str, int] = {}
        for r in requests:
            agent = agents.setdefault(
                r["agent_id"],
                {
                    "id": r["agent_id"],
                    "role": r["agent_role"],
                    "requests": 0,
                    "prompt_tokens": 0,
                    "cached_tokens": 0,
                    "cross_agent_cached_tokens": 0,
                },
            )
            agent["requests"] += 1
            for key in ("prompt_tokens", "cached_tokens", "cross_agent_cached_tokens"):
                agent[key] += r[key] or 0
            if r["engine"]:
                engines[r["engine"]] = engines.get(r["engine"], 0) + 1
        prompt = sum(r["prompt_tokens"] or 0 for r in requests)
        cached = sum(r["cached_tokens"] or 0 for r in requests)
        firsts = [r["first_token_at"] for r in requests if r["first_token_at"] is not None]
        ends = [r["ended_at"] for r in requests if r["ended_at"] is not None]
        start = requests[0]["started_at"]
        return {
            "id": wf["id"],
            "state": "active",
            "created_at": wf["created_at"],
            "last_active_at": max(ends, default=start),
            "ttl_s": 600.0,
            "home_engine": max(engines, key=lambda e: engines[e]) if engines else None,
            "engines": engines,
            "context_ids": [],
            "agents": list(agents.values()),
            "requests": requests,
            "handoffs": wf["handoffs"],
            "totals": {
                "requests": len(requests),
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "cross_agent_cached_tokens": 0,
                "hit_rate": cached / prompt if prompt else None,
                "cross_agent_hit_rate": 0.0 if prompt else None,
                "workflow_ttft_s": min(firsts) - start if firsts else None,
                "completion_time_s": max(ends) - start if ends else None,
            },
        }

    def install(self, app: web.Application, hooks: list[Any]) -> None:
        hooks.append(self)

        async def listing(request: web.Request) -> web.Response:
            data = []
            for wf in self.workflows.values():
                d = self.detail(wf)
                data.append(
                    {
                        "id": d["id"],
                        "state": d["state"],
                        "created_at": d["created_at"],
                        "last_active_at": d["last_active_at"],
                        "agents": len(d["agents"]),
                        "requests": len(d["requests"]),
                        "home_engine": d["home_engine"],
                    }
                )
            return web.json_response({"object": "list", "data": data})

        async def one(request: web.Request) -> web.Response:
            wf = self.workflows.get(request.match_info["id"])
            if wf is None:
                raise NotFound(f"no workflow {request.match_info['id']!r}")
            return web.json_response(self.detail(wf))

        async def end(request: web.Request) -> web.Response:
            wf = self.workflows.pop(request.match_info["id"], None)
            if wf is None:
                raise NotFound(f"no workflow {request.match_info['id']!r}")
            completion = self.detail(wf)["totals"]["completion_time_s"]
            if self.metrics is not None and completion is not None:
                self.metrics.workflow_completion.observe(completion)
            return web.json_response({"id": wf["id"], "state": "ended"})

        app.router.add_get("/v1/workflows", listing)
        app.router.add_get("/v1/workflows/{id}", one)
        app.router.add_delete("/v1/workflows/{id}", end)
