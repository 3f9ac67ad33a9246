"""Workflow tags held in a context variable, so concurrent agents in one process stay apart.

`with workflow("wf-1", agent="planner"):` pushes a scope; every call an instrumented client makes
inside it carries the scope's tags. Scopes nest (an inner scope overrides the fields it sets and
inherits the rest) and follow Python's context rules: each asyncio task, and each thread started
through `contextvars.copy_context().run` or `asyncio.to_thread`, sees the scope it was started in.

A scope also remembers the X-Request-Id of the last answer the router gave inside it, and offers
it as the next call's parent (X-Parent-Request-Id), which is how the router sees hand-offs.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, fields, replace
from types import TracebackType
from typing import Any
from urllib.parse import quote

from hiveroute.metadata import (
    BAGGAGE_CARRIER,
    HEADER_CARRIER,
    MAX_ID_LENGTH,
    RequestMetadata,
    parse_baggage,
)


@dataclass(frozen=True)
class WorkflowTags:
    """What one call says about itself; None fields are not sent."""

    workflow_id: str | None = None
    agent_id: str | None = None
    agent_role: str | None = None
    session_id: str | None = None
    stage: str | None = None
    parent_request_id: str | None = None
    priority: int | None = None

    @classmethod
    def from_metadata(cls, metadata: RequestMetadata) -> WorkflowTags:
        """The tags of a parsed request (context refs are not tags and are left out)."""
        return cls(**{f.name: getattr(metadata, f.name) for f in fields(cls)})

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def outgoing_headers(self, baggage: str | None = None) -> dict[str, str]:
        """X-* headers, plus baggage when `baggage` is given or a value is not plain ASCII."""
        result = self.headers()
        non_ascii = any(
            not str(getattr(self, f.name)).isascii()
            for f in fields(self)
            if getattr(self, f.name) is not None
        )
        if baggage is not None or non_ascii:
            merged = self.baggage(baggage)
            if merged:
                result["baggage"] = merged
        return result

    def merged(self, other: WorkflowTags) -> WorkflowTags:
        """These tags with every field `other` sets taking its value."""
        changes = {f.name: getattr(other, f.name) for f in fields(other)}
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def headers(self) -> dict[str, str]:
        """The X-* headers hiveroute reads; values that are not plain ASCII go in baggage only."""
        result: dict[str, str] = {}
        for name, header in HEADER_CARRIER.items():
            value = getattr(self, name)
            if value is None:
                continue
            text = str(value)
            if text.isascii():
                result[header] = text
        return result

    def baggage(self, existing: str | None = None) -> str | None:
        """A W3C baggage header with these tags added to `existing` (its own keys kept)."""
        present = parse_baggage(existing)
        members = [existing.strip()] if existing and existing.strip() else []
        for name, key in BAGGAGE_CARRIER.items():
            value = getattr(self, name)
            if value is None or key in present:
                continue
            members.append(f"{key}={quote(str(value), safe='')}")
        return ",".join(members) or None


def _check(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{what} is longer than {MAX_ID_LENGTH} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError(f"{what} must not contain control characters")
    return value


class _Scope:
    """One entered `workflow(...)` block: its full tags and the last request id seen in it."""

    __slots__ = ("chain", "last_request_id", "outer", "tags")

    def __init__(self, tags: WorkflowTags, outer: _Scope | None, chain: bool) -> None:
        self.tags = tags
        self.outer = outer
        self.chain = chain
        self.last_request_id: str | None = None

    def effective_tags(self) -> WorkflowTags:
        if self.tags.parent_request_id is not None or not self.chain:
            return self.tags
        scope: _Scope | None = self
        while scope is not None:
            if scope.last_request_id is not None:
                return replace(self.tags, parent_request_id=scope.last_request_id)
            if scope.tags.workflow_id != self.tags.workflow_id:
                break
            scope = scope.outer
        return self.tags

    def record(self, request_id: str) -> None:
        """Remember `request_id` here and in the enclosing scopes of the same workflow."""
        scope: _Scope | None = self
        while scope is not None and scope.tags.workflow_id == self.tags.workflow_id:
            scope.last_request_id = request_id
            scope = scope.outer


_CURRENT: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "hiveroute_workflow_scope", default=None
)


class workflow:
    """Tag the calls made inside the block with a workflow, agent, role, session and stage.

    Use as `with` or `async with`. Arguments left out are inherited from the enclosing block;
    `workflow()` with no id inside another block only changes what it names (an agent, say).
    `chain=False` stops sending the previous answer's request id as X-Parent-Request-Id.
    """

    def __init__(
        self,
        workflow_id: str | None = None,
        *,
        agent: str | None = None,
        role: str | None = None,
        session: str | None = None,
        stage: str | None = None,
        parent: str | None = None,
        priority: int | None = None,
        chain: bool = True,
    ) -> None:
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise TypeError(f"priority must be an int, got {type(priority).__name__}")
        self.tags = WorkflowTags(
            workflow_id=_check(workflow_id, "workflow_id"),
            agent_id=_check(agent, "agent"),
            agent_role=_check(role, "role"),
            session_id=_check(session, "session"),
            stage=_check(stage, "stage"),
            parent_request_id=_check(parent, "parent"),
            priority=priority,
        )
        self.chain = chain
        self._tokens: list[contextvars.Token[_Scope | None]] = []
        self._scope: _Scope | None = None

    def __enter__(self) -> workflow:
        outer = _CURRENT.get()
        tags = outer.tags.merged(self.tags) if outer is not None else self.tags
        if outer is not None and self.tags.parent_request_id is None:
            tags = replace(tags, parent_request_id=None)  # chained afresh, not copied
        self._scope = _Scope(tags, outer, self.chain)
        self._tokens.append(_CURRENT.set(self._scope))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _CURRENT.reset(self._tokens.pop())

    async def __aenter__(self) -> workflow:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    @property
    def last_request_id(self) -> str | None:
        """The X-Request-Id of the last answer received in (the last entry of) this block."""
        return self._scope.last_request_id if self._scope is not None else None


def current_tags() -> WorkflowTags | None:
    """The tags a call made now would carry (None outside every `workflow` block)."""
    scope = _CURRENT.get()
    return scope.effective_tags() if scope is not None else None


def record_request_id(request_id: str) -> None:
    """Note the router's answer id in the current block, as the next call's parent."""
    scope = _CURRENT.get()
    if scope is not None and request_id:
        scope.record(request_id)
