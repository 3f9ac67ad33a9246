"""hiveroute as an MCP server: generation, shared contexts and workflow numbers as MCP tools.

Built on the official `mcp` SDK's MCPServer. Each tool call's `_meta` (io.hiveroute/workflowId,
io.hiveroute/agentId, io.hiveroute/agentRole, io.hiveroute/stage, ... and W3C traceparent /
baggage) becomes the routing metadata of the router calls it makes, so an MCP host's workflow
reaches the router; explicit tool arguments override `_meta`. Shared contexts are also MCP
resources, `hiveroute://contexts/{context_id}`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.types import Resource as MCPResource

from hiveroute.errors import BadRequest
from hiveroute.integrations.router_api import RouterAPIError, RouterClient
from hiveroute.integrations.tags import WorkflowTags
from hiveroute.metadata import MAX_CONTEXT_REFS, metadata_from_mcp_meta

log = logging.getLogger("hiveroute.mcp")

CONTEXT_URI_PREFIX = "hiveroute://contexts/"
MAX_LISTED_CONTEXTS = 200
MAX_GENERATE_TOKENS = 32_768
TRACE_KEYS = ("traceparent", "tracestate", "baggage")

INSTRUCTIONS = (
    "hiveroute routes LLM calls of multi-agent workflows to the engine that already holds their "
    "KV cache. Name your workflow and agent (tool arguments or _meta io.hiveroute/workflowId, "
    "io.hiveroute/agentId, io.hiveroute/agentRole, io.hiveroute/stage) on every call; register "
    "large shared documents once with register_context and pass their ids to generate."
)


def request_meta(ctx: Context[Any, Any]) -> Mapping[str, Any]:
    """The calling request's `_meta` (empty when the host sent none)."""
    try:
        meta = ctx.request_context.meta
    except ValueError:  # outside a request
        return {}
    return meta if isinstance(meta, Mapping) else {}


def routing_tags(meta: Mapping[str, Any], overrides: WorkflowTags) -> WorkflowTags:
    """`_meta` mapped onto routing tags, then the explicit tool arguments on top."""
    try:
        from_meta = WorkflowTags.from_metadata(metadata_from_mcp_meta(meta))
    except BadRequest as exc:
        raise ToolError(f"bad _meta: {exc.message}") from None
    return from_meta.merged(overrides)


def routing_headers(meta: Mapping[str, Any], tags: WorkflowTags) -> dict[str, str]:
    """Headers for the router: the tags as X-* headers plus the trace keys of `_meta`."""
    headers: dict[str, str] = {}
    for key in TRACE_KEYS:
        value = meta.get(key)
        if isinstance(value, str) and value and value.isprintable():
            headers[key] = value
    headers.update(tags.outgoing_headers(headers.get("baggage")))
    return headers


def _tool_error(exc: RouterAPIError) -> ToolError:
    return ToolError(exc.message)


def _check_text(value: str | None, what: str) -> None:
    if value is not None and not value.strip():
        raise ToolError(f"{what} must not be empty")


class HiverouteMCPServer(MCPServer[Any]):
    """MCPServer whose resource list includes every registered shared context."""

    def __init__(self, router: RouterClient, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.router = router

    async def list_resources(self) -> list[MCPResource]:
        resources = await super().list_resources()
        try:
            contexts = await self.router.list_contexts()
        except RouterAPIError as exc:
            log.warning("cannot list shared contexts: %s", exc.message)
            return resources
        for item in contexts[:MAX_LISTED_CONTEXTS]:
            context_id = str(item.get("id", ""))
            if not context_id:
                continue
            scope = item.get("workflow_id") or "global"
            resources.append(
                MCPResource(
                    uri=CONTEXT_URI_PREFIX + context_id,
                    name=str(item.get("name") or context_id),
                    description=f"shared context ({scope}, {item.get('tokens', '?')} tokens)",
                    mime_type="text/plain",
                    size=item.get("bytes") if isinstance(item.get("bytes"), int) else None,
                )
            )
        return resources


def build_mcp_server(router: RouterClient, *, default_model: str | None = None) -> MCPServer[Any]:
    """The MCP server: tools generate, register_context, get_context, workflow_status."""
    server = HiverouteMCPServer(
        router, name="hiveroute", instructions=INSTRUCTIONS, log_level="WARNING"
    )
    models: list[str] = []

    async def pick_model(model: str | None) -> str:
        if model:
            return model
        if default_model:
            return default_model
        if not models:
            try:
                models.extend(await router.models())
            except RouterAPIError as exc:
                raise _tool_error(exc) from None
        if not models:
            raise ToolError("the router serves no model yet; pass `model` explicitly")
        return models[0]

    @server.tool()
    async def generate(
        ctx: Context[Any, Any],
        prompt: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        model: str | None = None,
        max_tokens: int = 256,
        temperature: float | None = None,
        context_ids: list[str] | None = None,
        endpoint: Literal["chat", "completions"] = "chat",
        workflow_id: str | None = None,
        agent_id: str | None = None,
        agent_role: str | None = None,
        session_id: str | None = None,
        stage: str | None = None,
        parent_request_id: str | None = None,
    ) -> dict[str, Any]:
        """Generate text through the hiveroute router, tagged with workflow and agent.

        Give `prompt` (a user message) or `messages` (OpenAI chat messages); `context_ids`
        puts registered shared contexts in front. Workflow fields default to the request's
        _meta. Returns the text with the router's request id, engine and token usage.
        """
        if (prompt is None) == (messages is None):
            raise ToolError("give exactly one of `prompt` or `messages`")
        _check_text(prompt, "prompt")
        if messages is not None and not messages:
            raise ToolError("`messages` must not be empty")
        if endpoint == "completions" and messages is not None:
            raise ToolError("the completions endpoint takes `prompt`, not `messages`")
        if not 1 <= max_tokens <= MAX_GENERATE_TOKENS:
            raise ToolError(f"max_tokens must be between 1 and {MAX_GENERATE_TOKENS}")
        if context_ids is not None and len(context_ids) > MAX_CONTEXT_REFS:
            raise ToolError(f"at most {MAX_CONTEXT_REFS} context_ids")
        meta = request_meta(ctx)
        explicit = WorkflowTags(
            workflow_id=workflow_id,
            agent_id=agent_id,
            agent_role=agent_role,
            session_id=session_id,
            stage=stage,
            parent_request_id=parent_request_id,
        )
        tags = routing_tags(meta, explicit)
        body: dict[str, Any] = {"model": await pick_model(model), "max_tokens": max_tokens}
        if temperature is not None:
            body["temperature"] = temperature
        if context_ids:
            body["hiveroute"] = {"context_refs": list(context_ids)}
        headers = routing_headers(meta, tags)
        try:
            if endpoint == "chat":
                body["messages"] = (
                    messages if messages is not None else [{"role": "user", "content": prompt}]
                )
                answer = await router.chat(body, headers)
            else:
                body["prompt"] = prompt
                answer = await router.completion(body, headers)
        except RouterAPIError as exc:
            raise _tool_error(exc) from None
        choices = answer.body.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        if endpoint == "chat":
            message = choice.get("message") or {}
            text = message.get("content") if isinstance(message, dict) else None
        else:
            text = choice.get("text")
        return {
            "text": text or "",
            "finish_reason": choice.get("finish_reason"),
            "model": answer.body.get("model", body["model"]),
            "request_id": answer.request_id,
            "engine": answer.engine,
            "usage": answer.body.get("usage"),
            "workflow_id": tags.workflow_id,
            "agent_id": tags.agent_id,
        }

    @server.tool()
    async def register_context(
        ctx: Context[Any, Any],
        text: str,
        id: str | None = None,
        name: str | None = None,
        workflow_id: str | None = None,
        global_context: bool = False,
    ) -> dict[str, Any]:
        """Register a shared context (a document many agents read) with the router.

        It is scoped to `workflow_id` (default: the request's _meta workflow) unless
        `global_context` is true. Pass the returned id to generate's `context_ids`, or read it
        as the resource hiveroute://contexts/{id}.
        """
        _check_text(text, "text")
        if global_context and workflow_id:
            raise ToolError("give `workflow_id` or `global_context`, not both")
        scope = None
        if not global_context:
            scope = workflow_id or routing_tags(request_meta(ctx), WorkflowTags()).workflow_id
        try:
            return await router.create_context(text, context_id=id, workflow_id=scope, name=name)
        except RouterAPIError as exc:
            raise _tool_error(exc) from None

    @server.tool()
    async def get_context(id: str) -> dict[str, Any]:
        """A registered shared context, with its text."""
        _check_text(id, "id")
        try:
            return await router.get_context(id)
        except RouterAPIError as exc:
            raise _tool_error(exc) from None

    @server.tool()
    async def workflow_status(
        ctx: Context[Any, Any], workflow_id: str | None = None, max_requests: int = 20
    ) -> dict[str, Any]:
        """The router's numbers for a workflow: agents, cache hits, hand-offs, recent requests.

        `workflow_id` defaults to the request's _meta workflow; `max_requests` bounds how many
        of the most recent requests are listed (0 for none).
        """
        wanted = workflow_id or routing_tags(request_meta(ctx), WorkflowTags()).workflow_id
        if not wanted:
            raise ToolError("give `workflow_id` (or io.hiveroute/workflowId in _meta)")
        if max_requests < 0:
            raise ToolError("max_requests must be 0 or more")
        try:
            status = await router.get_workflow(wanted)
        except RouterAPIError as exc:
            raise _tool_error(exc) from None
        requests = status.get("requests")
        if isinstance(requests, list):
            status["requests"] = requests[-max_requests:] if max_requests else []
        return status

    @server.resource(
        CONTEXT_URI_PREFIX + "{context_id}",
        name="shared-context",
        description="A shared context registered with the router (its text)",
        mime_type="text/plain",
    )
    async def context_resource(context_id: str) -> str:
        try:
            context = await router.get_context(context_id)
        except RouterAPIError as exc:
            if exc.status == 404:
                raise ResourceNotFoundError(f"no shared context {context_id!r}") from None
            raise ResourceError(exc.message) from None
        return str(context.get("text", ""))

    return server
