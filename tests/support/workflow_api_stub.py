"""A stand-in for the router's workflow and context API (WORKFLOW_API.md), for tests only.

It sits in front of a real router: /v1/contexts and /v1/workflows are answered here, from the
metadata and usage of the completions it relays; everything else goes to the router
unchanged. Context references are expanded into a leading system message (chat) or a prefix
(completions). It implements only what the integration tests use.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from hiveroute.errors import BadRequest, HiverouteError, NotFound
from hiveroute.metadata import extract_metadata


class WorkflowAPIStub:
    def __init__(self, router_url: str) -> None:
        self.router_url = router_url
        self.contexts: dict[str, dict[str, Any]] = {}
        self.workflows: dict[str, dict[str, Any]] = {}
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application(middlewares=[self._errors])
        app.router.add_post("/v1/contexts", self._create_context)
        app.router.add_get("/v1/contexts", self._list_contexts)
        app.router.add_get("/v1/contexts/{id}", self._get_context)
        app.router.add_get("/v1/workflows/{id}", self._get_workflow)
        app.router.add_post("/v1/chat/completions", self._relay_completion)
        app.router.add_post("/v1/completions", self._relay_completion)
        app.router.add_get("/v1/models", self._relay_get)
        self._session = aiohttp.ClientSession()
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except HiverouteError as exc:
            return web.json_response(exc.to_json(), status=exc.status)

    async def _create_context(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body.get("text"), str) or not body["text"]:
            raise BadRequest("'text' must be a non-empty string", param="text")
        context_id = body.get("id") or f"ctx-{uuid.uuid4().hex[:12]}"
        context = {
            "id": context_id,
            "workflow_id": body.get("workflow_id"),
            "name": body.get("name"),
            "bytes": len(body["text"].encode()),
            "tokens": len(body["text"].split()),
            "created_at": time.time(),
            "text": body["text"],
        }
        self.contexts[context_id] = context
        return web.json_response({k: v for k, v in context.items() if k != "text"}, status=201)

    async def _list_contexts(self, request: web.Request) -> web.Response:
        wanted = request.query.get("workflow_id")
        data = [
            {k: v for k, v in c.items() if k != "text"}
            for c in self.contexts.values()
            if wanted is None or c["workflow_id"] == wanted
        ]
        return web.json_response({"object": "list", "data": data})

    async def _get_context(self, request: web.Request) -> web.Response:
        context = self.contexts.get(request.match_info["id"])
        if context is None:
            raise NotFound(f"no context {request.match_info['id']!r}")
        return web.json_response(context)

    async def _get_workflow(self, request: web.Request) -> web.Response:
        workflow = self.workflows.get(request.match_info["id"])
        if workflow is None:
            raise NotFound(f"no workflow {request.match_info['id']!r}")
        agents: dict[str, dict[str, Any]] = {}
        for r in workflow["requests"]:
            agent = agents.setdefault(
                r["agent_id"] or "",
                {"id": r["agent_id"], "role": r["agent_role"], "requests": 0},
            )
            agent["requests"] += 1
            for key in ("prompt_tokens", "cached_tokens"):
                agent[key] = agent.get(key, 0) + (r[key] or 0)
        totals = {
            "requests": len(workflow["requests"]),
            "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in workflow["requests"]),
            "cached_tokens": sum(r["cached_tokens"] or 0 for r in workflow["requests"]),
        }
        return web.json_response(
            {**workflow, "state": "active", "agents": list(agents.values()), "totals": totals}
        )

    async def _relay_get(self, request: web.Request) -> web.Response:
        assert self._session is not None
        async with self._session.get(self.router_url + request.path) as upstream:
            return web.Response(
                body=await upstream.read(), status=upstream.status, content_type="application/json"
            )

    def _expand(self, body: dict[str, Any], refs: tuple[str, ...]) -> dict[str, Any]:
        texts = []
        for ref in refs:
            if ref not in self.contexts:
                raise BadRequest(f"unknown context id {ref!r}", param="context_refs")
            texts.append(self.contexts[ref]["text"])
        if not texts:
            return body
        joined = "\n\n".join(texts)
        if "messages" in body:
            return {**body, "messages": [{"role": "system", "content": joined}, *body["messages"]]}
        return {**body, "prompt": joined + "\n\n" + str(body.get("prompt", ""))}

    async def _relay_completion(self, request: web.Request) -> web.Response:
        assert self._session is not None
        body = await request.json()
        metadata, clean = extract_metadata(body, request.headers)
        clean = self._expand(clean, metadata.context_refs)
        forward = {
            k: v
            for k, v in request.headers.items()
            if k.lower().startswith("x-") or k.lower() in ("baggage", "traceparent")
        }
        async with self._session.post(
            self.router_url + request.path, json=clean, headers=forward
        ) as upstream:
            raw = await upstream.read()
            headers = CIMultiDict(
                (k, v) for k, v in upstream.headers.items() if k.lower().startswith("x-")
            )
            status = upstream.status
        if metadata.workflow_id and status < 400:
            usage = json.loads(raw).get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            workflow = self.workflows.setdefault(
                metadata.workflow_id, {"id": metadata.workflow_id, "requests": []}
            )
            workflow["requests"].append(
                {
                    "request_id": headers.get("X-Request-Id"),
                    "agent_id": metadata.agent_id,
                    "agent_role": metadata.agent_role,
                    "stage": metadata.stage,
                    "parent_request_id": metadata.parent_request_id,
                    "engine": headers.get("X-Hiveroute-Engine"),
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "cached_tokens": details.get("cached_tokens"),
                    "status": status,
                }
            )
        return web.Response(
            body=raw, status=status, headers=headers, content_type="application/json"
        )
