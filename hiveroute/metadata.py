"""Request metadata: which workflow, agent, role, session and stage a request belongs to.

Agents announce themselves through whatever their framework lets them set, so the router reads
every carrier DESIGN.md names. For each field the first carrier that has it wins, in this order:

1. the body object ``"hiveroute": {...}`` (removed before the request reaches an engine);
2. headers ``X-Workflow-Id``, ``X-Agent-Id``, ``X-Agent-Role``, ``X-Session-Id``,
   ``X-Workflow-Stage``, ``X-Parent-Request-Id`` (and ``X-Hiveroute-Priority``);
3. the W3C ``baggage`` header keys ``workflow.id``, ``agent.id``, ``agent.role``, ``session.id``,
   ``workflow.stage``;
4. OpenAI's body field ``metadata`` keys ``workflow_id``, ``agent_id``, ``agent_role``,
   ``session_id``, ``stage``.

Then the keys other tools already send (README, "Session keys agents send", cites each one's
source), in this order: vllm-router's ``vllm_xargs.agentic_context``; Dynamo's
``X-Dynamo-Session-ID`` / ``X-Dynamo-Parent-Session-ID``; Claude Code's
``x-claude-code-session-id`` / ``-agent-id`` / ``-parent-agent-id``; Codex's ``session-id``
(``session_id``), ``thread-id`` (``conversation_id``), ``x-codex-parent-thread-id``,
``x-openai-subagent``; OpenCode's ``x-session-affinity`` / ``x-opencode-session`` /
``x-parent-session-id``; ``x-user-id``; the body's ``prompt_cache_key``; Anthropic's
``metadata.user_id``; the body's ``user``. A value of the wrong type or over 256 characters is a
400 naming its carrier, whichever carrier it is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from hiveroute.errors import BadRequest

MAX_ID_LENGTH = 256
MAX_CONTEXT_REFS = 64
PRIORITY_RANGE = (-(2**31), 2**31 - 1)

MAX_AGENTIC_CONTEXT_BYTES = 16 * 1024  # as vllm-router bounds a JSON-encoded agentic_context

LOG_FIELDS = (
    "workflow_id", "agent_id", "agent_role", "session_id", "stage", "parent_request_id",
    "parent_agent_id", "parent_session_id", "priority", "context_refs",
)  # fmt: skip
STRING_FIELDS = (
    "workflow_id",
    "agent_id",
    "agent_role",
    "session_id",
    "stage",
    "parent_request_id",
)

HEADER_CARRIER = {
    "workflow_id": "X-Workflow-Id",
    "agent_id": "X-Agent-Id",
    "agent_role": "X-Agent-Role",
    "session_id": "X-Session-Id",
    "stage": "X-Workflow-Stage",
    "parent_request_id": "X-Parent-Request-Id",
    "priority": "X-Hiveroute-Priority",
}

BAGGAGE_CARRIER = {
    "workflow_id": "workflow.id",
    "agent_id": "agent.id",
    "agent_role": "agent.role",
    "session_id": "session.id",
    "stage": "workflow.stage",
}

OPENAI_METADATA_CARRIER = {
    "workflow_id": "workflow_id",
    "agent_id": "agent_id",
    "agent_role": "agent_role",
    "session_id": "session_id",
    "stage": "stage",
}

# MCP `_meta` keys (reverse-DNS prefixed, as the MCP spec asks of custom keys).
MCP_META_CARRIER = {
    "workflow_id": "io.hiveroute/workflowId",
    "agent_id": "io.hiveroute/agentId",
    "agent_role": "io.hiveroute/agentRole",
    "session_id": "io.hiveroute/sessionId",
    "stage": "io.hiveroute/stage",
    "parent_request_id": "io.hiveroute/parentRequestId",
    "priority": "io.hiveroute/priority",
}


@dataclass(frozen=True)
class RequestMetadata:
    """Who sent a request, as far as the agent system told us."""

    workflow_id: str | None = None
    agent_id: str | None = None
    agent_role: str | None = None
    session_id: str | None = None
    stage: str | None = None
    parent_request_id: str | None = None
    parent_agent_id: str | None = None  # the agent that spawned this one (a subagent's parent)
    parent_session_id: str | None = None  # the session this one was forked from
    priority: int | None = None
    context_refs: tuple[str, ...] = field(default_factory=tuple)

    @property
    def affinity_key(self) -> str | None:
        """The key that session affinity hashes on: the session, else the workflow."""
        return self.session_id or self.workflow_id

    def to_log(self) -> dict[str, Any]:
        """The fields that are set, for a structured log line (runs per request: no asdict)."""
        found: dict[str, Any] = {}
        for name in LOG_FIELDS:
            value = getattr(self, name)
            if value:
                found[name] = list(value) if isinstance(value, tuple) else value
        return found


def parse_baggage(header: str | None) -> dict[str, str]:
    """Parse a W3C baggage header (``k=v;prop, k2=v2``) into a dict; malformed members are skipped."""
    if not header:
        return {}
    result: dict[str, str] = {}
    for member in header.split(","):
        key_value = member.split(";", 1)[0].strip()
        if "=" not in key_value:
            continue
        key, value = key_value.split("=", 1)
        key = key.strip()
        if key:
            result[key] = unquote(value.strip())
    return result


def _check_string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string, got {type(value).__name__}", param=where)
    if len(value) > MAX_ID_LENGTH:
        raise BadRequest(f"{where} is longer than {MAX_ID_LENGTH} characters", param=where)
    return value


def _check_priority(value: Any, where: str) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise BadRequest(f"{where} must be an integer", param=where) from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{where} must be an integer", param=where)
    low, high = PRIORITY_RANGE
    if not low <= value <= high:
        raise BadRequest(f"{where} must be between {low} and {high}", param=where)
    return value


def _check_context_refs(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a list of context ids", param=where)
    if len(value) > MAX_CONTEXT_REFS:
        raise BadRequest(f"{where} has more than {MAX_CONTEXT_REFS} entries", param=where)
    return tuple(_check_string(item, f"{where}[{i}]") for i, item in enumerate(value))


def _from_body_object(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise BadRequest("'hiveroute' must be a JSON object", param="hiveroute")
    known = {*STRING_FIELDS, "priority", "context_refs"}
    unknown = sorted(set(obj) - known)
    if unknown:
        raise BadRequest(
            f"unknown field(s) in 'hiveroute': {', '.join(unknown)}; "
            f"known fields are {', '.join(sorted(known))}",
            param="hiveroute",
        )
    found: dict[str, Any] = {}
    for name in STRING_FIELDS:
        if obj.get(name) is not None:
            found[name] = _check_string(obj[name], f"hiveroute.{name}")
    if obj.get("priority") is not None:
        found["priority"] = _check_priority(obj["priority"], "hiveroute.priority")
    if obj.get("context_refs") is not None:
        found["context_refs"] = _check_context_refs(obj["context_refs"], "hiveroute.context_refs")
    return found


def _from_string_map(
    source: Mapping[str, Any], carrier: Mapping[str, str], where: str
) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, key in carrier.items():
        value = source.get(key)
        if value is None or value == "":
            continue
        if name == "priority":
            found[name] = _check_priority(value, f"{where} {key}")
        else:
            found[name] = _check_string(value, f"{where} {key}")
    return found


# --- the session keys other tools send (README: "Session keys agents send") ----------------

# Per tool, each field with the headers that carry it, first one found wins.
HeaderCarrier = dict[str, tuple[str, ...]]
DYNAMO_HEADERS: HeaderCarrier = {
    "session_id": ("X-Dynamo-Session-ID",),
    "parent_session_id": ("X-Dynamo-Parent-Session-ID",),
}
CLAUDE_CODE_HEADERS: HeaderCarrier = {
    "session_id": ("x-claude-code-session-id",),
    "agent_id": ("x-claude-code-agent-id",),
    "parent_agent_id": ("x-claude-code-parent-agent-id",),
}
CODEX_HEADERS: HeaderCarrier = {
    "session_id": ("session-id", "session_id"),
    "agent_id": ("thread-id",),
    "parent_agent_id": ("x-codex-parent-thread-id",),
    "agent_role": ("x-openai-subagent",),
}
OPENCODE_HEADERS: HeaderCarrier = {
    "session_id": ("x-session-affinity", "x-opencode-session"),
    "parent_session_id": ("x-parent-session-id",),
}
USER_HEADERS: HeaderCarrier = {"session_id": ("x-user-id",)}
AGENT_HEADER_CARRIERS: tuple[HeaderCarrier, ...] = (
    DYNAMO_HEADERS, CLAUDE_CODE_HEADERS, CODEX_HEADERS, OPENCODE_HEADERS, USER_HEADERS,
)  # fmt: skip
# each carrier's header names, lower-cased (header names are case-insensitive)
_CARRIER_NAMES = tuple(
    frozenset(name.lower() for names in carrier.values() for name in names)
    for carrier in AGENT_HEADER_CARRIERS
)

# vllm-router's `vllm_xargs.agentic_context` keys per field (its aliases in its order).
AGENTIC_CONTEXT_KEYS = {
    "workflow_id": ("task_id",),
    "session_id": ("session_id",),
    "agent_id": ("agent_id", "program_id"),
    "agent_role": ("agent_role",),
    "parent_agent_id": ("parent_agent_id", "parent_program_id", "parent_id"),
}


def _from_headers(
    headers: Mapping[str, str], carrier: Mapping[str, tuple[str, ...]]
) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, keys in carrier.items():
        for key in keys:
            value = headers.get(key)
            if value is not None and value.strip() != "":
                found[name] = _check_string(value.strip(), f"header {key}")
                break
    return found


def _agentic_context(body: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """vllm-router's agentic context (an object, or one encoded as a JSON string), and the body
    without it: the engine would refuse an object inside `vllm_xargs`, and it is routing
    metadata, removed like the `hiveroute` object."""
    xargs = body.get("vllm_xargs")
    if not isinstance(xargs, dict) or xargs.get("agentic_context") is None:
        return None, body
    where = "vllm_xargs.agentic_context"
    raw = xargs["agentic_context"]
    if isinstance(raw, str):
        if len(raw.encode()) > MAX_AGENTIC_CONTEXT_BYTES:
            raise BadRequest(
                f"{where} is longer than {MAX_AGENTIC_CONTEXT_BYTES} bytes", param=where
            )
        try:
            raw = json.loads(raw)
        except ValueError:
            raise BadRequest(f"{where} must be a JSON object", param=where) from None
    if not isinstance(raw, dict):
        raise BadRequest(f"{where} must be a JSON object", param=where)
    rest = {k: v for k, v in xargs.items() if k != "agentic_context"}
    clean = {k: v for k, v in body.items() if k != "vllm_xargs"}
    if rest:
        clean["vllm_xargs"] = rest
    return raw, clean


def _from_agentic_context(context: Mapping[str, Any]) -> dict[str, Any]:
    where = "vllm_xargs.agentic_context"
    found: dict[str, Any] = {}
    for name, keys in AGENTIC_CONTEXT_KEYS.items():
        for key in keys:
            value = context.get(key)
            if value is None or value == "":
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                value = str(value)  # ids may be numbers, as vllm-router accepts
            found[name] = _check_string(value, f"{where}.{key}")
            break
    if context.get("priority") is not None:
        # Checked, not passed on: vllm-router orders its own queue by it, larger first, while
        # `priority` here is vLLM's (lower first, refused by engines without priority scheduling).
        _check_priority(context["priority"], f"{where}.priority")
    return found


def _body_session_keys(body: dict[str, Any]) -> list[dict[str, Any]]:
    """`prompt_cache_key`, Anthropic's `metadata.user_id` and `user`, in that order."""
    carriers: list[dict[str, Any]] = []
    for read in _BODY_SESSION_READERS:
        value, where = read(body)
        if value is not None and value != "":
            carriers.append({"session_id": _check_string(value, where)})
    return carriers


def _metadata_user_id(body: dict[str, Any]) -> tuple[Any, str]:
    metadata = body.get("metadata")
    return (metadata.get("user_id") if isinstance(metadata, dict) else None), "metadata.user_id"


_BODY_SESSION_READERS: tuple[Callable[[dict[str, Any]], tuple[Any, str]], ...] = (
    lambda body: (body.get("prompt_cache_key"), "prompt_cache_key"),
    _metadata_user_id,
    lambda body: (body.get("user"), "user"),
)


def extract_metadata(
    body: dict[str, Any], headers: Mapping[str, str]
) -> tuple[RequestMetadata, dict[str, Any]]:
    """Read the request's metadata from every carrier; return it with the body the engine gets.

    The returned body is the input without its ``hiveroute`` object and without
    ``vllm_xargs.agentic_context`` (a shallow copy when either was there, the same dict
    otherwise). Raises BadRequest for wrong types and over-long values in any carrier.
    """
    carriers: list[dict[str, Any]] = [_from_body_object(body.get("hiveroute"))]
    # a request has a few headers and there are dozens of known names: look up only those sent
    present = {name.lower() for name in headers}
    sent = {field: name for field, name in HEADER_CARRIER.items() if name.lower() in present}
    carriers.append(_from_string_map(headers, sent, "header"))
    carriers.append(
        _from_string_map(parse_baggage(headers.get("baggage")), BAGGAGE_CARRIER, "baggage")
    )
    openai_metadata = body.get("metadata")
    if isinstance(openai_metadata, dict):
        carriers.append(_from_string_map(openai_metadata, OPENAI_METADATA_CARRIER, "metadata"))
    context, clean = _agentic_context(body)
    if context is not None:
        carriers.append(_from_agentic_context(context))
    carriers.extend(
        _from_headers(headers, carrier)
        for carrier, names in zip(AGENT_HEADER_CARRIERS, _CARRIER_NAMES, strict=True)
        if not names.isdisjoint(present)
    )
    carriers.extend(_body_session_keys(body))
    merged: dict[str, Any] = {}
    for found in carriers:
        for name, value in found.items():
            merged.setdefault(name, value)
    if "hiveroute" in clean:
        clean = {k: v for k, v in clean.items() if k != "hiveroute"}
    body = clean
    return RequestMetadata(**merged), body


def metadata_from_mcp_meta(meta: Mapping[str, Any]) -> RequestMetadata:
    """Map an MCP request's ``_meta`` onto routing metadata (baggage fills what keys leave out)."""
    found = _from_string_map(meta, MCP_META_CARRIER, "_meta")
    baggage = meta.get("baggage")
    if isinstance(baggage, str):
        for name, value in _from_string_map(
            parse_baggage(baggage), BAGGAGE_CARRIER, "baggage"
        ).items():
            found.setdefault(name, value)
    return RequestMetadata(**found)
