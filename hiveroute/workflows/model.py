"""The records the workflow registry keeps, and how they read as JSON (WORKFLOW_API.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ACTIVE = "active"
ENDED = "ended"
EXPIRED = "expired"


@dataclass
class WorkflowSettings:
    """What a workflow declared (or the defaults it got on its first request)."""

    id: str
    created_at: float
    ttl_s: float
    state: str = ACTIVE
    ended_at: float | None = None
    context_ids: list[str] = field(default_factory=list)
    declared_agents: list[dict[str, str]] = field(default_factory=list)
    expected_fanout: int | None = None
    shared_prefix_layout: bool = False
    priority_scheduling: bool = False
    declared: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkflowSettings:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class RequestRecord:
    request_id: str
    agent_id: str | None
    agent_role: str | None
    stage: str | None
    parent_request_id: str | None
    started_at: float
    engine: str | None = None
    first_token_at: float | None = None
    ended_at: float | None = None
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    cross_agent_cached_tokens: int | None = None
    status: str = "running"  # running | ok | error | cancelled | HTTP status as text
    parent_agent_id: str | None = None  # a subagent's parent agent (or session)

    def to_json(self) -> dict[str, Any]:
        # every field is a scalar: a copy of the fields, not `asdict`'s deep copy of each
        # (written twice per request, that was a twentieth of a loaded router's CPU)
        return dict(vars(self))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Handoff:
    from_agent: str | None
    to_agent: str | None
    from_request_id: str
    to_request_id: str
    latency_s: float

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))  # scalars only, as RequestRecord's


def ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 6) if whole > 0 else None
