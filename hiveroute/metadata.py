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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from hiveroute.errors import BadRequest

MAX_ID_LENGTH = 256
MAX_CONTEXT_REFS = 64
PRIORITY_RANGE = (-(2**31), 2**31 - 1)

LOG_FIELDS = (
    "workflow_id", "agent_id", "agent_role", "session_id", "stage", "parent_request_id",
    "priority", "context_refs",
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


def extract_metadata(
    body: dict[str, Any], headers: Mapping[str, str]
) -> tuple[RequestMetadata, dict[str, Any]]:
    """Read the request's metadata from every carrier; return it with the body the engine gets.

    The returned body is the input without its ``hiveroute`` object (a shallow copy when that
    object was there, the same dict otherwise). Raises BadRequest for wrong types.
    """
    carriers: list[dict[str, Any]] = [_from_body_object(body.get("hiveroute"))]
    carriers.append(_from_string_map(headers, HEADER_CARRIER, "header"))
    carriers.append(
        _from_string_map(parse_baggage(headers.get("baggage")), BAGGAGE_CARRIER, "baggage")
    )
    openai_metadata = body.get("metadata")
    if isinstance(openai_metadata, dict):
        carriers.append(_from_string_map(openai_metadata, OPENAI_METADATA_CARRIER, "metadata"))
    merged: dict[str, Any] = {}
    for found in carriers:
        for name, value in found.items():
            merged.setdefault(name, value)
    if "hiveroute" in body:
        body = {k: v for k, v in body.items() if k != "hiveroute"}
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
