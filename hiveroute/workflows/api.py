"""The control API: /v1/workflows and /v1/contexts (see WORKFLOW_API.md for the contract)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hiveroute.errors import BadRequest, Forbidden, NotFound
from hiveroute.gateway.auth import principal_of
from hiveroute.gateway.body import parse_json_object, read_body
from hiveroute.workflows.expansion import SEPARATOR, canonical_order
from hiveroute.workflows.openapi import handle_openapi
from hiveroute.workflows.placement import new_context_home
from hiveroute.workflows.registry import WorkflowView, check_id
from hiveroute.workflows.scope import scoped
from hiveroute.workflows.service import WorkflowService

SERVICE_KEY: web.AppKey[WorkflowService] = web.AppKey("workflows", WorkflowService)

API_BODY_LIMIT = 64 * 1024
MAX_LIST_LIMIT = 10_000  # GET /v1/workflows?limit=


def _tenant(request: web.Request) -> str | None:
    """The caller's tenant; the admin (or anyone on an open router) may name one: ?tenant=."""
    principal = principal_of(request)
    if principal.tenant is not None:
        return principal.tenant
    if "tenant" not in request.query:
        return None
    return check_id(request.query["tenant"], "query parameter 'tenant'")


def _workflow_key(request: web.Request) -> str:
    return scoped(_tenant(request), request.match_info["workflow_id"])


def _service(request: web.Request) -> WorkflowService:
    return request.app[SERVICE_KEY]


async def _json_body(request: web.Request, limit: int) -> dict[str, Any]:
    return parse_json_object(await read_body(request, limit))


# --- workflows ----------------------------------------------------------------------------


async def create_workflow(request: web.Request) -> web.Response:
    service = _service(request)
    tenant = _tenant(request)
    body = await _json_body(request, API_BODY_LIMIT)
    context_ids = body.get("context_ids")
    workflow_id = scoped(tenant, body["id"]) if isinstance(body.get("id"), str) else None
    if isinstance(context_ids, list):
        for cid in context_ids:
            if not isinstance(cid, str):
                continue
            context = await service.contexts.get(scoped(tenant, cid), required=False)
            if context is None:
                raise BadRequest(
                    f"unknown context {cid!r} in 'context_ids'; register it first",
                    param="context_ids",
                )
            if context.workflow_id is not None and context.workflow_id != workflow_id:
                raise Forbidden(f"context {cid!r} belongs to another workflow", param="context_ids")
    settings = await service.registry.declare(body, tenant)
    view = await service.registry.view(settings.id, fresh=True)
    if view is not None and settings.context_ids:
        await _prewarm(service, view)
    return web.json_response(await service.registry.describe(settings.id), status=201)


async def list_workflows(request: web.Request) -> web.Response:
    service = _service(request)
    await service.flush()
    raw = request.query.get("limit")
    limit = None
    if raw is not None:
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not (
            1 <= int(raw) <= MAX_LIST_LIMIT
        ):
            raise BadRequest(f"'limit' must be an integer 1..{MAX_LIST_LIMIT}", param="limit")
        limit = int(raw)
    summaries, total = await service.registry.summaries(_tenant(request), limit=limit)
    return web.json_response({"object": "list", "data": summaries, "total": total})


async def get_workflow(request: web.Request) -> web.Response:
    service = _service(request)
    await service.flush()
    return web.json_response(await service.registry.describe(_workflow_key(request)))


async def delete_workflow(request: web.Request) -> web.Response:
    service = _service(request)
    await service.flush()
    key = _workflow_key(request)
    ended = await service.registry.end(key)
    await service.contexts.delete_workflow(key)  # an ended workflow's contexts serve no one
    return web.json_response(ended)


# --- contexts -----------------------------------------------------------------------------


async def create_context(request: web.Request) -> web.Response:
    service = _service(request)
    tenant = _tenant(request)
    body = await _json_body(request, service.contexts.max_bytes * 2 + API_BODY_LIMIT)
    workflow_id = body.get("workflow_id")
    view: WorkflowView | None = None
    if workflow_id is not None:
        check_id(workflow_id, "'workflow_id'")
        view = await service.registry.ensure(scoped(tenant, workflow_id))
    context, _ = await service.contexts.register(body, tenant)
    if view is not None and context.id not in view.settings.context_ids:
        view.settings.context_ids.append(context.id)
        await service.registry.save(view.settings)
        await _prewarm(service, view)
    return web.json_response(context.to_json(), status=201)


async def list_contexts(request: web.Request) -> web.Response:
    service = _service(request)
    tenant = _tenant(request)
    workflow_id = request.query.get("workflow_id")
    scope = scoped(tenant, workflow_id) if workflow_id else None
    contexts = await service.contexts.list(scope, tenant=tenant)
    return web.json_response({"object": "list", "data": [c.to_json() for c in contexts]})


async def get_context(request: web.Request) -> web.Response:
    service = _service(request)
    context = await service.contexts.get(scoped(_tenant(request), request.match_info["context_id"]))
    assert context is not None
    return web.json_response(context.to_json(with_text=True))


async def delete_context(request: web.Request) -> web.Response:
    service = _service(request)
    context_id = request.match_info["context_id"]
    if not await service.contexts.delete(scoped(_tenant(request), context_id)):
        raise NotFound(f"no context {context_id!r}", code="context_not_found")
    return web.json_response({"id": context_id, "deleted": True})


# --- pre-warm -----------------------------------------------------------------------------


async def shared_prefix_of(service: WorkflowService, view: WorkflowView) -> str | None:
    """The workflow's canonical shared prefix: its contexts in registration order."""
    resolved = {}
    for cid in view.settings.context_ids:
        context = await service.contexts.get(cid, required=False)
        if context is not None:
            resolved[cid] = context
    if not resolved:
        return None
    return SEPARATOR.join(c.text for c in canonical_order(resolved, view.settings.context_ids))


async def _prewarm(service: WorkflowService, view: WorkflowView) -> None:
    """Prefill the shared prefix on the home engine (chosen now if need be), in the background."""
    pool = service.pool
    if not service.layout_on(view) or not service.keep_warm.enabled:
        return
    prefix = await shared_prefix_of(service, view)
    if prefix is None:
        return
    view.shared_prefix = prefix
    view.warm_text = prefix
    candidates = pool.candidates(view.model)
    if not candidates:
        return
    if view.home is None:
        best = new_context_home(service, candidates, len(prefix))
        await service.registry.claim_home(view, best.name)
    engine = pool.get(view.home) if view.home else None
    if engine is not None and engine.healthy:
        service.spawn(service.keep_warm.prewarm(view, engine, prefix))


# --- mounting -----------------------------------------------------------------------------


def add_routes(app: web.Application, service: WorkflowService) -> None:
    """Mount the control API on the router's app (the assembly calls it)."""
    app[SERVICE_KEY] = service
    app.router.add_post("/v1/workflows", create_workflow)
    app.router.add_get("/v1/workflows", list_workflows)
    app.router.add_get("/v1/workflows/{workflow_id}", get_workflow)
    app.router.add_delete("/v1/workflows/{workflow_id}", delete_workflow)
    app.router.add_post("/v1/contexts", create_context)
    app.router.add_get("/v1/contexts", list_contexts)
    app.router.add_get("/v1/contexts/{context_id}", get_context)
    app.router.add_delete("/v1/contexts/{context_id}", delete_context)
    app.router.add_get("/openapi.json", handle_openapi)


__all__ = ["add_routes"]
