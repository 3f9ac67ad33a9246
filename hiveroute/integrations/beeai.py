"""BeeAI framework hook: every LLM call of a BeeAI agent or workflow carries its workflow tags.

BeeAI runs everything inside a RunContext; nested runs (an agent inside a workflow, a chat
model inside an agent) inherit their parent's `context` dict and share its `group_id`.
`HiverouteMiddleware` is a BeeAI run middleware: bound to a run, it stores the tags in that
run's context (so every nested run inherits them) and listens on the run's emitter for chat
model `start` events, where it adds the X-Workflow-Id / X-Agent-Id / X-Agent-Role / ... headers
to the call (`extra_headers`, which BeeAI's LiteLLM-based OpenAI chat model sends).

The workflow id is the middleware's `workflow_id`, or else the run's BeeAI `group_id`; the
agent name is `agent`, or else the BeeAI agent's own name when the middleware is bound to one.

    llm = router_chat_model("http://127.0.0.1:8080", "my-model")
    await planner.run(...).middleware(HiverouteMiddleware(agent="planner", role="planner"))
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from beeai_framework.adapters.openai.backend.chat import OpenAIChatModel
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "hiveroute.integrations.beeai needs the BeeAI framework: pip install 'hiveroute[beeai]' "
        f"(or pip install beeai-framework); import failed with: {exc}"
    ) from exc
from beeai_framework.backend.chat import ChatModel
from beeai_framework.backend.events import ChatModelStartEvent
from beeai_framework.context import RunContext
from beeai_framework.emitter import EmitterOptions, EventMeta

from hiveroute.integrations.tags import WorkflowTags, workflow

CONTEXT_KEY = "hiveroute"

log = logging.getLogger("hiveroute.beeai")


def _agent_name(instance: object) -> str | None:
    """The name a BeeAI agent was given (None for runnables that are not agents)."""
    from beeai_framework.agents import BaseAgent

    if isinstance(instance, BaseAgent):
        name = instance.meta.name
        return name or None
    return None


def _is_chat_model_start(event: EventMeta) -> bool:
    return event.name == "start" and isinstance(event.creator, ChatModel)


def run_tags(context: dict[str, Any]) -> WorkflowTags | None:
    """The tags stored in a BeeAI run context (or an event's context) by the middleware."""
    tags = context.get(CONTEXT_KEY)
    return tags if isinstance(tags, WorkflowTags) else None


async def _tag_chat_call(data: Any, event: EventMeta) -> None:
    """On a chat model's start: add the run's tags as headers (headers set by the caller win)."""
    tags = run_tags(event.context)
    if tags is None or not isinstance(data, ChatModelStartEvent):
        return
    model_input = data.input
    settings = getattr(event.creator, "_settings", None)
    configured = settings.get("extra_headers") if isinstance(settings, dict) else None
    given = getattr(model_input, "extra_headers", None)
    headers = tags.outgoing_headers()
    for source in (configured, given):
        if isinstance(source, dict):
            headers.update({str(k): str(v) for k, v in source.items()})
    model_input.extra_headers = headers  # type: ignore[attr-defined]  # extra="allow" model


class HiverouteMiddleware:
    """A BeeAI run middleware that tags every chat-model call inside the run.

    Pass it to `run(...).middleware(...)`, or to a runnable's `middlewares=[...]` so every run
    of that agent is tagged. Fields left out are inherited from an enclosing tagged run, then
    from an enclosing `hiveroute.client.workflow(...)` block; the workflow id falls back to the
    BeeAI run's `group_id`.
    """

    def __init__(
        self,
        *,
        workflow_id: str | None = None,
        agent: str | None = None,
        role: str | None = None,
        session: str | None = None,
        stage: str | None = None,
        priority: int | None = None,
    ) -> None:
        # workflow() validates the values exactly as the OpenAI-client helper does
        self.tags = workflow(
            workflow_id, agent=agent, role=role, session=session, stage=stage, priority=priority
        ).tags
        self.last_workflow_id: str | None = None

    def bind(self, ctx: RunContext) -> None:
        from hiveroute.integrations.tags import current_tags

        inherited = run_tags(ctx.context) or current_tags() or WorkflowTags()
        tags = inherited.merged(self.tags)
        if self.tags.agent_id is None:
            name = _agent_name(ctx.instance)
            if name is not None:
                tags = tags.merged(WorkflowTags(agent_id=name))
        if tags.workflow_id is None:
            tags = tags.merged(WorkflowTags(workflow_id=ctx.group_id))
        self.last_workflow_id = tags.workflow_id
        ctx.context[CONTEXT_KEY] = tags
        ctx.emitter.context[CONTEXT_KEY] = tags
        ctx.emitter.on(
            _is_chat_model_start,
            _tag_chat_call,
            EmitterOptions(is_blocking=True, match_nested=True),
        )


def router_chat_model(
    router_url: str, model: str, *, api_key: str = "hiveroute", **kwargs: Any
) -> OpenAIChatModel:
    """BeeAI's OpenAI-compatible chat model pointed at a hiveroute router."""
    base = router_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return OpenAIChatModel(model, base_url=base, api_key=api_key, **kwargs)
