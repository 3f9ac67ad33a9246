"""The workflow registry: workflows, their agents and requests, kept in the state store.

A workflow comes into being when declared (POST /v1/workflows) or on the first request that
carries its id. Every request is recorded (bounded: the most recent `max_requests`), with its
agent, engine, timings and token counts; counters that several replicas update are hash
increments. Idle workflows expire after their TTL; ended and expired ones stay readable for
`retain_s` and are then purged.

Hot-path reads go through a local view per workflow (settings and home engines), refreshed
from the store at most every `view_ttl_s`, so routing a request of a known workflow costs no
store round trip. On a remote store (Redis, or the parent's store under `serve --workers`) a
view past its time is refreshed in the background, given a `spawn`: the request routes on the
view it has, as it would have a moment before. Refreshing in its path cost four round trips in
turn, each a wait for another process: on a busy two-core host 15 ms for one request in ten.
For the same reason a new workflow is created in the round trip that reads it
(`load_or_create`), and its home is claimed after its first request is routed (`claim_home`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from hiveroute.errors import BadRequest, Conflict, NotFound, TooManyRequests
from hiveroute.state.store import StateStore, all_of, dumps, loads, set_json
from hiveroute.workflows.model import (
    ACTIVE,
    ENDED,
    EXPIRED,
    Handoff,
    RequestRecord,
    WorkflowSettings,
    ratio,
)
from hiveroute.workflows.scope import scoped, tenant_of, unscoped, visible

log = logging.getLogger("hiveroute.workflows")

MAX_ID = 256
OTHER_AGENT = "(other)"
STAT_FIELDS = ("requests", "prompt_tokens", "cached_tokens", "cross_agent_cached_tokens")

Listener = Callable[[str, str], None]  # (workflow id, new state)
# runs a coroutine as a task its owner keeps, logs and waits for (WorkflowService.spawn)
Spawn = Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]


async def _nothing() -> None:
    """An awaitable of None, for a read a request does not need."""
    return None


def _k(kind: str, workflow_id: str) -> str:
    return f"wf:{kind}:{workflow_id}"


def check_id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID:
        raise BadRequest(f"{what} must be a non-empty string of at most {MAX_ID} characters")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise BadRequest(f"{what} must not contain whitespace or control characters")
    return value


@dataclass
class WorkflowView:
    """A replica's cached view of one workflow: what routing reads on every request."""

    settings: WorkflowSettings
    home: str | None = None
    secondaries: list[str] = field(default_factory=list)
    fetched_at: float = 0.0
    agents: set[str] = field(default_factory=set)
    service_tokens: float = 0.0  # attained service (PLAS), uncached prompt + completion tokens
    last_active_at: float = 0.0
    # Local runtime state (this replica's traffic), read by placement and keep-warm.
    path: str | None = None  # the endpoint its requests use
    model: str | None = None
    warm_text: str | None = None  # the text its prompts start with (learned or its contexts)
    # the block keys (PARENT_BLOCK tokens each) all its prompts routed here began with
    shared_chain: list[int] | None = None
    shared_prefix: str | None = None  # the canonical shared-context prefix (layout)
    # each request in flight (by its RoutingRequest's identity) -> monotonic start
    in_flight: dict[int, float] = field(default_factory=dict)

    def busy(self, now: float, stale_after_s: float) -> bool:
        """Whether a request of this workflow is in flight here (ones older than
        `stale_after_s` never finished, e.g. refused before routing, and are dropped)."""
        for request, started in list(self.in_flight.items()):
            if now - started > stale_after_s:
                del self.in_flight[request]
        return bool(self.in_flight)

    last_used: dict[str, float] = field(default_factory=dict)  # engine -> monotonic seconds
    warmed_at: dict[str, float] = field(default_factory=dict)  # engine -> last keep-warm
    # key kind ("req", "stats", ...) -> when this replica last renewed that key's TTL (`_renew`)
    renewed_at: dict[str, float] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.settings.id

    @property
    def engines(self) -> list[str]:
        """Home first, then secondaries in the order they were added."""
        return ([self.home] if self.home else []) + [e for e in self.secondaries if e != self.home]


@dataclass
class RegistryLimits:
    ttl_s: float = 600.0
    retain_s: float = 3600.0
    max_requests: int = 256
    max_agents: int = 256
    max_handoffs: int = 256
    max_workflows: int = 10_000
    view_ttl_s: float = 1.0


class WorkflowRegistry:
    def __init__(
        self,
        store: StateStore,
        limits: RegistryLimits | None = None,
        *,
        clock: Callable[[], float] = time.time,
        spawn: Spawn | None = None,
    ) -> None:
        self.store = store
        self.limits = limits or RegistryLimits()
        self.clock = clock
        # without it (or on an in-process store, whose reads never wait) a view past its
        # time is refreshed in the caller's path
        self._spawn = spawn
        self._views: OrderedDict[str, WorkflowView] = OrderedDict()
        self._refreshing: set[str] = set()  # workflows whose view a task is refreshing
        self._listeners: list[Listener] = []
        self.handoff_observer: Callable[[float], None] | None = None
        # Workflow-level figures for the router's metrics (observability/metrics.py).
        self.workflow_ttft_observer: Callable[[float], None] | None = None
        self.completion_observer: Callable[[float], None] | None = None

    def on_state_change(self, listener: Listener) -> None:
        """Hear when a workflow ends or expires (keep-warm stops then)."""
        self._listeners.append(listener)

    def _notify(self, workflow_id: str, state: str) -> None:
        for listener in self._listeners:
            try:
                listener(workflow_id, state)
            except Exception:
                log.exception("workflow state listener failed")

    def _key_ttl(self, settings: WorkflowSettings) -> float:
        return settings.ttl_s + self.limits.retain_s

    def _renew(self, view: WorkflowView, kinds: Sequence[str]) -> list[Awaitable[bool]]:
        """The TTL renewals of the workflow's keys of `kinds` that are due: each key is renewed
        at most once per tenth of its TTL by this replica (on every request it was five to
        eight of a request's thirty store calls), for its TTL plus that tenth, so it still
        outlives the workflow's last request by its whole TTL. A key this replica has not
        renewed yet (new, or new to it) is renewed at once."""
        ttl = self._key_ttl(view.settings)
        every = ttl / 10
        now = self.clock()
        due = [k for k in kinds if now - view.renewed_at.get(k, -math.inf) >= every]
        for kind in due:
            view.renewed_at[kind] = now
        return [self.store.expire(_k(kind, view.id), ttl + every) for kind in due]

    # --- settings and views ---------------------------------------------------------------

    def _effective_state(self, settings: WorkflowSettings, last_active_at: float) -> str:
        if settings.state == ACTIVE and self.clock() - last_active_at > settings.ttl_s:
            return EXPIRED
        return settings.state

    def _read_calls(self, workflow_id: str) -> list[Awaitable[Any]]:
        """The reads a view is built from (`_view_from`); they do not depend on each other."""
        return [
            self.store.get(_k("doc", workflow_id)),
            self.store.hgetall(_k("stats", workflow_id)),
            self.store.get(_k("home", workflow_id)),
            self.store.hgetall(_k("homes", workflow_id)),
        ]

    async def _load(self, workflow_id: str) -> WorkflowView | None:
        """The workflow as the store has it, in one round trip."""
        raw_doc, stats, home, homes = await all_of(self.store, *self._read_calls(workflow_id))
        return self._view_from(workflow_id, raw_doc, stats, home, homes)

    def _view_from(
        self,
        workflow_id: str,
        raw_doc: str | None,
        stats: dict[str, str],
        home: str | None,
        homes: dict[str, str],
    ) -> WorkflowView | None:
        """The view the store's answers to `_read_calls` describe. One this replica knew active
        that another ended (or whose keys expired) is told to the listeners here: no longer
        active, it is not swept again, and keep-warm would have kept its pins for good."""
        known = self._views.get(workflow_id)
        was_active = known is not None and known.settings.state == ACTIVE
        if raw_doc is None:
            self._views.pop(workflow_id, None)
            if was_active:
                self._notify(workflow_id, EXPIRED)
            return None
        settings = WorkflowSettings.from_json(loads(raw_doc))
        view = self._views.get(workflow_id) or WorkflowView(settings=settings)
        if view.settings.created_at != settings.created_at:  # recreated since: new keys
            view.renewed_at.clear()
        view.settings = settings
        view.home = home
        view.secondaries = sorted(homes, key=lambda e: float(homes[e]))
        view.service_tokens = float(stats.get("service_tokens", 0.0))
        view.last_active_at = float(stats.get("last_active_at", settings.created_at))
        self._keep(view)
        if was_active and settings.state != ACTIVE:
            self._notify(workflow_id, settings.state)
        return view

    def _keep(self, view: WorkflowView) -> None:
        """Hold `view` as fetched now: the most recently used of at most `max_workflows`."""
        view.fetched_at = self.clock()
        self._views[view.id] = view
        self._views.move_to_end(view.id)
        while len(self._views) > self.limits.max_workflows:
            self._views.popitem(last=False)

    async def view(self, workflow_id: str, *, fresh: bool = False) -> WorkflowView | None:
        """The workflow's view; `fresh`: read from the store now, whatever the view's age."""
        view = self._views.get(workflow_id)
        if view is None or fresh:
            return await self._load(workflow_id)
        if self.clock() - view.fetched_at <= self.limits.view_ttl_s:
            return view
        if self._spawn is None or self.store.in_process:
            return await self._load(workflow_id)
        if workflow_id not in self._refreshing:
            self._refreshing.add(workflow_id)
            self._spawn(self._refresh(workflow_id))
        return view

    async def _refresh(self, workflow_id: str) -> None:
        try:
            await self._load(workflow_id)
        finally:
            self._refreshing.discard(workflow_id)

    def cached_view(self, workflow_id: str) -> WorkflowView | None:
        """The local view without a store read (the synchronous routing path)."""
        return self._views.get(workflow_id)

    def active_views(self) -> list[WorkflowView]:
        return [v for v in self._views.values() if v.settings.state == ACTIVE]

    async def declare(self, body: dict[str, Any], tenant: str | None = None) -> WorkflowSettings:
        """POST /v1/workflows: 201 with the settings; 409 if the id is taken by an active one."""
        name = body.get("id")
        if name is None:
            name = f"wf-{secrets.token_hex(8)}"
        check_id(name, "'id'")
        workflow_id = scoped(tenant, name)
        settings = self._settings_from_body(workflow_id, body, tenant)
        existing = await self.view(workflow_id, fresh=True)
        if existing is not None:
            state = self._effective_state(existing.settings, existing.last_active_at)
            if state == ACTIVE:
                raise Conflict(f"workflow {name!r} exists and is active", param="id")
            await self._purge(workflow_id)
        await self._check_capacity()
        if not await self._create(settings):  # another declaration (or a request) came first
            raise Conflict(f"workflow {name!r} was created meanwhile", param="id")
        view = await self.view(workflow_id, fresh=True)
        assert view is not None
        for agent in settings.declared_agents:
            await self._add_agent(view, agent["id"], agent.get("role"))
        return settings

    def _settings_from_body(
        self, workflow_id: str, body: dict[str, Any], tenant: str | None
    ) -> WorkflowSettings:
        known = {
            "id",
            "agents",
            "expected_fanout",
            "context_ids",
            "ttl_s",
            "shared_prefix_layout",
            "priority_scheduling",
        }
        unknown = sorted(set(body) - known)
        if unknown:
            raise BadRequest(
                f"unknown field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        ttl = body.get("ttl_s", self.limits.ttl_s)
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= 7 * 86400:
            raise BadRequest("'ttl_s' must be a number of seconds in (0, 604800]", param="ttl_s")
        fanout = body.get("expected_fanout")
        if fanout is not None and (
            isinstance(fanout, bool) or not isinstance(fanout, int) or not 0 < fanout <= 10_000
        ):
            raise BadRequest(
                "'expected_fanout' must be an integer from 1 to 10000", param="expected_fanout"
            )
        agents: list[dict[str, str]] = []
        raw_agents = body.get("agents", [])
        if not isinstance(raw_agents, list) or len(raw_agents) > self.limits.max_agents:
            raise BadRequest(
                f"'agents' must be a list of at most {self.limits.max_agents} objects",
                param="agents",
            )
        for i, agent in enumerate(raw_agents):
            if not isinstance(agent, dict) or set(agent) - {"id", "role"}:
                raise BadRequest(
                    f"agents[{i}] must be an object with 'id' and optional 'role'", param="agents"
                )
            entry = {"id": check_id(agent.get("id"), f"agents[{i}].id")}
            if agent.get("role") is not None:
                entry["role"] = check_id(agent["role"], f"agents[{i}].role")
            agents.append(entry)
        context_ids = body.get("context_ids", [])
        if not isinstance(context_ids, list) or len(context_ids) > 64:
            raise BadRequest(
                "'context_ids' must be a list of at most 64 context ids", param="context_ids"
            )
        for i, cid in enumerate(context_ids):
            check_id(cid, f"context_ids[{i}]")
        flags: dict[str, bool] = {}
        for name in ("shared_prefix_layout", "priority_scheduling"):
            value = body.get(name, False)
            if not isinstance(value, bool):
                raise BadRequest(f"'{name}' must be true or false", param=name)
            flags[name] = value
        return WorkflowSettings(
            id=workflow_id,
            created_at=self.clock(),
            ttl_s=float(ttl),
            context_ids=[scoped(tenant, c) for c in dict.fromkeys(context_ids)],
            declared_agents=agents,
            expected_fanout=fanout,
            declared=True,
            shared_prefix_layout=flags["shared_prefix_layout"],
            priority_scheduling=flags["priority_scheduling"],
        )

    async def _check_capacity(self) -> None:
        limit = self.limits.max_workflows
        if len(self._views) < limit // 2:
            return  # far from the limit (as far as this replica can tell): skip the scan
        if len(await self.store.scan("wf:doc:", limit=limit + 1)) >= limit:
            raise TooManyRequests(
                f"the router holds {limit} workflows (max_workflows); end some with "
                "DELETE /v1/workflows/{id} or wait for idle ones to expire",
                retry_after_s=5.0,
            )

    async def _create(self, settings: WorkflowSettings) -> bool:
        """Create the workflow unless a replica just did; one round trip. The stats are
        written either way: the workflow is active now, whoever created it."""
        ttl = self._key_ttl(settings)
        stats_key = _k("stats", settings.id)
        created, *_ = await all_of(
            self.store,
            self.store.set_if_absent(_k("doc", settings.id), dumps(settings.to_json()), ttl_s=ttl),
            self.store.hset(stats_key, {"last_active_at": repr(settings.created_at)}),
            self.store.expire(stats_key, ttl),
        )
        return bool(created)

    def _new_settings(self, workflow_id: str, ttl_s: float | None) -> WorkflowSettings:
        return WorkflowSettings(
            id=workflow_id, created_at=self.clock(), ttl_s=ttl_s or self.limits.ttl_s
        )

    def _created(self, settings: WorkflowSettings) -> WorkflowView:
        """The view of a workflow this replica has just created: what was written is all
        there is to read."""
        view = WorkflowView(settings=settings, last_active_at=settings.created_at)
        self._keep(view)
        return view

    def holds(self, workflow_id: str) -> bool:
        """Whether this replica has a view of the workflow (of any age)."""
        return workflow_id in self._views

    async def load_or_create(self, workflow_id: str) -> WorkflowView:
        """The workflow for a request that runs whatever the store holds, when this replica
        has no view of it: created unless a replica did, and read, in one round trip (a new
        workflow's first request waited for a read, then a creation). Its stats are left to
        the request's `record_start`: written here they would renew an ended one's."""
        await self._check_capacity()
        settings = self._new_settings(workflow_id, None)
        created, *read = await all_of(
            self.store,
            self.store.set_if_absent(
                _k("doc", workflow_id), dumps(settings.to_json()), ttl_s=self._key_ttl(settings)
            ),
            *self._read_calls(workflow_id),
        )
        if created:
            return self._created(settings)
        view = self._view_from(workflow_id, *read)
        if view is None:  # purged between the creation and the read: create it again
            return await self.create_or_revive(workflow_id, None)
        return view

    async def ensure(self, workflow_id: str, *, ttl_s: float | None = None) -> WorkflowView:
        """The workflow a request names, created on first sight; revived if it had expired."""
        return await self.create_or_revive(workflow_id, await self.view(workflow_id), ttl_s=ttl_s)

    async def create_or_revive(
        self, workflow_id: str, view: WorkflowView | None, *, ttl_s: float | None = None
    ) -> WorkflowView:
        """`ensure` for a caller that has just read the workflow's `view` (None: the store had
        none), which costs a new workflow's first request one round trip less. A replica that
        created it since is found by the creation, which then fails."""
        if view is None:
            await self._check_capacity()
            settings = self._new_settings(workflow_id, ttl_s)
            if await self._create(settings):
                view = self._created(settings)
            else:  # another replica created it first: read its settings
                view = await self.view(workflow_id, fresh=True)
            assert view is not None
        state = self._effective_state(view.settings, view.last_active_at)
        if view.settings.state == ENDED or state == ENDED:
            raise Conflict(
                f"workflow {unscoped(workflow_id)!r} has ended (DELETE /v1/workflows); use a new workflow id",
                param="workflow_id",
            )
        if view.settings.state == EXPIRED:  # a late request revives an expired workflow
            view.settings.state = ACTIVE
            await self.save(view.settings)
        return view

    async def save(self, settings: WorkflowSettings) -> None:
        await set_json(
            self.store,
            _k("doc", settings.id),
            settings.to_json(),
            ttl_s=self._key_ttl(settings),
        )

    async def end(self, workflow_id: str) -> dict[str, Any]:
        view = await self.view(workflow_id, fresh=True)
        if view is None:
            raise NotFound(f"no workflow {unscoped(workflow_id)!r}", code="workflow_not_found")
        if view.settings.state != ENDED:
            view.settings.state = ENDED
            view.settings.ended_at = self.clock()
            await self.save(view.settings)
            await self._observe_completion(workflow_id)
            self._notify(workflow_id, ENDED)
        return {"id": unscoped(workflow_id), "state": ENDED}

    async def sweep(self) -> list[str]:
        """Mark idle workflows expired (and tell listeners); returns the ids that expired."""
        expired: list[str] = []
        now = self.clock()
        for local in self.active_views():
            if now - local.last_active_at <= local.settings.ttl_s:
                continue  # active here; only idle ones are checked against the store
            workflow_id = local.id
            view = await self.view(workflow_id, fresh=True)
            if view is None:
                self._notify(workflow_id, EXPIRED)
                continue
            if self._effective_state(view.settings, view.last_active_at) == EXPIRED:
                view.settings.state = EXPIRED
                await self.save(view.settings)
                await self._observe_completion(workflow_id)
                expired.append(workflow_id)
                self._notify(workflow_id, EXPIRED)
        return expired

    async def count_active(self, *, batch: int = 500) -> int:
        """Active workflows in the store: what every replica and worker sharing it reports
        alike (each one's views are only the workflows it served). Read `batch` workflows a
        round trip, and the loop is given a turn between rounds: at `max_workflows` that is
        20 rounds, not one stall."""
        ids = [
            key[len("wf:doc:") :]
            for key in await self.store.scan("wf:doc:", limit=self.limits.max_workflows)
        ]
        active = 0
        for first in range(0, len(ids), batch):
            some = ids[first : first + batch]
            reads: list[Awaitable[Any]] = []
            for workflow_id in some:
                reads.append(self.store.get(_k("doc", workflow_id)))
                reads.append(self.store.hget(_k("stats", workflow_id), "last_active_at"))
            answers = await all_of(self.store, *reads)
            for raw_doc, last in zip(answers[::2], answers[1::2], strict=True):
                if raw_doc is None:  # purged since the scan
                    continue
                settings = WorkflowSettings.from_json(loads(raw_doc))
                last_active_at = float(last) if last else settings.created_at
                if self._effective_state(settings, last_active_at) == ACTIVE:
                    active += 1
            await asyncio.sleep(0)
        return active

    async def _observe_completion(self, workflow_id: str) -> None:
        """Completion time (first request in to last response out) of a workflow that ended."""
        if self.completion_observer is None:
            return
        stats = await self.store.hgetall(_k("stats", workflow_id))
        first = _float(stats.get("first_started_at"))
        last = _float(stats.get("last_ended_at"))
        if first is not None and last is not None:
            self.completion_observer(max(0.0, last - first))

    async def _purge(self, workflow_id: str) -> None:
        kinds = ("doc", "stats", "home", "homes", "engines", "agents", "req", "order", "last")
        await self.store.delete(*(_k(kind, workflow_id) for kind in (*kinds, "handoffs")))
        self._views.pop(workflow_id, None)

    # --- home engines ---------------------------------------------------------------------

    async def claim_home(self, view: WorkflowView, engine: str) -> str:
        """Propose `engine` as the home; every replica reads back the same winner. On a remote
        store (given a `spawn`) the view takes `engine` at once and the claim is made in the
        background: the request that proposed it routes on this replica's choice, as it would
        if it had won, and another replica's winner reaches the view a round trip later."""
        if self._spawn is None or self.store.in_process:
            return await self._claim_home(view, engine)
        view.home = engine
        self._spawn(self._claim_home(view, engine))
        return engine

    async def _claim_home(self, view: WorkflowView, engine: str) -> str:
        key = _k("home", view.id)
        ttl = self._key_ttl(view.settings)
        if not await self.store.set_if_absent(key, engine, ttl_s=ttl):
            winner = await self.store.get(key)
            if winner is None:  # it expired in between: take it
                await self.store.set(key, engine, ttl_s=ttl)
                winner = engine
            engine = winner
        view.home = engine
        return engine

    async def replace_home(self, view: WorkflowView, old: str | None, engine: str) -> str:
        """Move the home (the old one left the pool), unless another replica already did."""
        key = _k("home", view.id)
        ttl = self._key_ttl(view.settings)
        if not await self.store.compare_and_set(key, old, engine, ttl_s=ttl):
            engine = await self.store.get(key) or engine
        view.home = engine
        return engine

    async def add_secondary(self, view: WorkflowView, engine: str) -> None:
        if engine not in view.secondaries:
            view.secondaries.append(engine)
        await self.store.hset(_k("homes", view.id), {engine: repr(self.clock())})
        await self.store.expire(_k("homes", view.id), self._key_ttl(view.settings))

    # --- requests -------------------------------------------------------------------------

    async def _add_agent(self, view: WorkflowView, agent: str, role: str | None) -> str:
        if agent in view.agents:
            return agent
        key = _k("agents", view.id)
        known = await self.store.hgetall(key)
        if agent not in known:
            if len(known) >= self.limits.max_agents:
                agent = OTHER_AGENT
            await self.store.hset(key, {agent: role or known.get(agent, "")})
            await self.store.expire(key, self._key_ttl(view.settings))
        elif role and not known[agent]:
            await self.store.hset(key, {agent: role})
        view.agents.add(agent)
        return agent

    def new_record(
        self,
        view: WorkflowView,
        *,
        request_id: str,
        agent_id: str | None,
        agent_role: str | None,
        stage: str | None,
        parent_request_id: str | None,
        parent_agent_id: str | None = None,
    ) -> RequestRecord:
        """A request's record, started now. Nothing is written: routing reads none of it, so
        `record_start` can run after the request is on its way."""
        now = self.clock()
        view.last_active_at = now
        return RequestRecord(
            request_id=request_id,
            agent_id=agent_id,
            agent_role=agent_role,
            stage=stage,
            parent_request_id=parent_request_id,
            started_at=now,
            parent_agent_id=parent_agent_id,
        )

    async def record_start(self, view: WorkflowView, record: RequestRecord) -> None:
        """Write a started request to the store: its agent (past `max_agents`, the record
        names OTHER_AGENT instead), the record, the hand-off into it, the workflow's stats."""
        wid = view.id
        if record.agent_id is not None:
            record.agent_id = await self._add_agent(view, record.agent_id, record.agent_role)
        # Two pipelined rounds (one round trip each to a shared store): the reads and the
        # independent writes, then what depends on them.
        request_id = record.request_id
        stats_key = _k("stats", wid)
        seen, _, dropped, first_started = await all_of(
            self.store,
            self._handoff_read(wid, record),
            self.store.hset(_k("req", wid), {request_id: dumps(record.to_json())}),
            self.store.push_bounded(_k("order", wid), request_id, self.limits.max_requests),
            self.store.hget(stats_key, "first_started_at"),
        )
        handoff = self._handoff(record, seen)
        if handoff is not None and self.handoff_observer is not None:
            self.handoff_observer(handoff.latency_s)
        stats = {"last_active_at": repr(max(record.started_at, view.last_active_at))}
        if first_started is None:
            stats["first_started_at"] = repr(record.started_at)
        second_round: list[Awaitable[Any]] = [self.store.hset(stats_key, stats)]
        if dropped:
            second_round.append(self.store.hdel(_k("req", wid), *dropped))
        kinds = ["req", "order", "stats", "doc"]
        if handoff is not None:
            second_round.append(
                self.store.push_bounded(
                    _k("handoffs", wid), dumps(handoff.to_json()), self.limits.max_handoffs
                )
            )
            kinds.append("handoffs")
        second_round += self._renew(view, kinds)
        await all_of(self.store, *second_round)

    def _handoff_read(self, workflow_id: str, record: RequestRecord) -> Awaitable[Any]:
        """What the hand-off into `record` is found from: its parent request's record, else
        every agent's latest end (`_handoff` reads the answer)."""
        if record.agent_id is None:
            return _nothing()
        if record.parent_request_id:
            return self.store.hget(_k("req", workflow_id), record.parent_request_id)
        return self.store.hgetall(_k("last", workflow_id))

    @staticmethod
    def _handoff(record: RequestRecord, seen: Any) -> Handoff | None:
        """The hand-off into this request: from its parent request, else its parent agent's
        (or session's) latest end, else the latest other agent's end (`seen`: what
        `_handoff_read` returned)."""
        me = record.agent_id
        if me is None or seen is None:
            return None
        source: dict[str, Any] | None = None
        if record.parent_request_id:
            parent = loads(seen)
            if parent.get("agent_id") != me and parent.get("ended_at") is not None:
                source = parent
        else:
            last = {agent: loads(raw) for agent, raw in seen.items()}
            parent_agent = record.parent_agent_id
            if parent_agent and parent_agent != me:  # a subagent: from its parent's end
                found = last.get(parent_agent)
                if found is not None and found.get("ended_at") is not None:
                    source = found
            else:
                mine = last.get(me, {}).get("ended_at") or 0.0
                start = record.started_at  # ends after it (read later) handed nothing to it
                others = [v for a, v in last.items() if a != me and mine < v["ended_at"] <= start]
                if others:
                    source = max(others, key=lambda v: v["ended_at"])
        if source is None:
            return None
        return Handoff(
            from_agent=source.get("agent_id"),
            to_agent=me,
            from_request_id=source["request_id"],
            to_request_id=record.request_id,
            latency_s=round(max(0.0, record.started_at - source["ended_at"]), 6),
        )

    async def finish_request(
        self,
        workflow_id: str,
        record: RequestRecord,
        *,
        engine: str | None,
        status: str,
        ttft_s: float | None,
        duration_s: float,
        prompt_tokens: int | None,
        cached_tokens: int | None,
        cross_agent_cached_tokens: int | None,
        completion_tokens: int | None,
    ) -> None:
        now = self.clock()
        wid = workflow_id
        record.engine = engine
        record.status = status
        record.ended_at = now
        started = now - duration_s
        if ttft_s is not None and status == "ok":
            record.ttft_s = round(ttft_s, 6)
            record.first_token_at = started + ttft_s
        record.prompt_tokens = prompt_tokens
        record.cached_tokens = cached_tokens
        record.cross_agent_cached_tokens = cross_agent_cached_tokens
        # Two pipelined rounds (one round trip each to a shared store), not one per call: the
        # counters and reads, then what depends on them.
        req_key, stats_key = _k("req", wid), _k("stats", wid)
        agent = record.agent_id
        increments = {
            "requests": 1,
            "prompt_tokens": prompt_tokens or 0,
            "cached_tokens": cached_tokens or 0,
            "cross_agent_cached_tokens": cross_agent_cached_tokens or 0,
        }
        counters = dict(increments)
        if agent is not None:
            counters.update({f"{name}|{agent}": amount for name, amount in increments.items()})
        service = max(0, (prompt_tokens or 0) - (cached_tokens or 0)) + (completion_tokens or 0)
        first_round = [
            self.store.hget(req_key, record.request_id),
            self.store.hget(stats_key, "first_token_at"),
            self.store.hget(stats_key, "first_started_at"),
            self.store.hincrbyfloat(stats_key, "service_tokens", service),
            self.store.hincrby_many(stats_key, counters),  # one call, not eight
        ]
        if engine is not None:  # None: refused before any engine was chosen
            first_round.append(self.store.hincrby(_k("engines", wid), engine, 1))
        if agent is not None and status == "ok":
            last = {"request_id": record.request_id, "agent_id": agent, "ended_at": now}
            first_round.append(self.store.hset(_k("last", wid), {agent: dumps(last)}))
        kept, first, first_started, total_service, *_ = await all_of(self.store, *first_round)
        updates = {"last_active_at": repr(now), "last_ended_at": repr(now)}
        if record.first_token_at is not None:
            if first is None or float(first) > record.first_token_at:
                updates["first_token_at"] = repr(record.first_token_at)
            started_at = _float(first_started)
            if first is None and started_at is not None and self.workflow_ttft_observer:
                self.workflow_ttft_observer(max(0.0, record.first_token_at - started_at))
        second_round: list[Awaitable[Any]] = [self.store.hset(stats_key, updates)]
        if kept is not None:  # a record dropped from the bounded list stays dropped
            second_round.append(
                self.store.hset(req_key, {record.request_id: dumps(record.to_json())})
            )
        view = self._views.get(wid)
        if view is not None:
            view.service_tokens = total_service
            view.last_active_at = now
            second_round += self._renew(view, ("engines", "last", "stats"))
        await all_of(self.store, *second_round)

    # --- reading --------------------------------------------------------------------------

    async def summaries(
        self, tenant: str | None = None, *, limit: int | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """The workflows `tenant` may see (None: all of them), oldest first, and how many
        there are. With `limit`: only that many, active ones first, then the most recently
        active (what a dashboard shows), and the counters of only those are read."""
        views = []
        for key in sorted(await self.store.scan("wf:doc:", limit=self.limits.max_workflows)):
            workflow_id = key[len("wf:doc:") :]
            if not visible(workflow_id, tenant):
                continue
            view = await self.view(workflow_id, fresh=True)
            if view is not None:
                views.append(view)
        total = len(views)
        if limit is None:
            views.sort(key=lambda v: v.settings.created_at)
        else:
            views.sort(
                key=lambda v: (
                    self._effective_state(v.settings, v.last_active_at) != ACTIVE,
                    -v.last_active_at,
                )
            )
            del views[limit:]
        return [await self._summary(view) for view in views], total

    async def _summary(self, view: WorkflowView) -> dict[str, Any]:
        workflow_id = view.id
        stats = await self.store.hgetall(_k("stats", workflow_id))
        agents = await self.store.hgetall(_k("agents", workflow_id))
        return {
            "id": unscoped(workflow_id),
            "tenant": tenant_of(workflow_id),
            "state": self._effective_state(view.settings, view.last_active_at),
            "created_at": view.settings.created_at,
            "last_active_at": view.last_active_at,
            "agents": len(agents),
            "requests": int(stats.get("requests", 0)),
            "home_engine": view.home,
        }

    async def describe(self, workflow_id: str) -> dict[str, Any]:
        view = await self.view(workflow_id, fresh=True)
        if view is None:
            raise NotFound(f"no workflow {unscoped(workflow_id)!r}", code="workflow_not_found")
        wid = workflow_id
        s = view.settings
        stats = await self.store.hgetall(_k("stats", wid))
        agents = await self.store.hgetall(_k("agents", wid))
        engines = await self.store.hgetall(_k("engines", wid))
        order = await self.store.lrange(_k("order", wid))
        raw_records = await self.store.hgetall(_k("req", wid))
        requests = [loads(raw_records[r]) for r in order if r in raw_records]
        handoffs = [loads(h) for h in await self.store.lrange(_k("handoffs", wid))]

        def stat(name: str, agent: str | None = None) -> int:
            return int(stats.get(name if agent is None else f"{name}|{agent}", 0))

        totals: dict[str, Any] = {name: stat(name) for name in STAT_FIELDS}
        totals["hit_rate"] = ratio(totals["cached_tokens"], totals["prompt_tokens"])
        totals["cross_agent_hit_rate"] = ratio(
            totals["cross_agent_cached_tokens"], totals["prompt_tokens"]
        )
        first_started = _float(stats.get("first_started_at"))
        first_token = _float(stats.get("first_token_at"))
        last_ended = _float(stats.get("last_ended_at"))
        totals["workflow_ttft_s"] = (
            round(first_token - first_started, 6) if first_started and first_token else None
        )
        totals["completion_time_s"] = (
            round(last_ended - first_started, 6) if first_started and last_ended else None
        )
        agent_rows = [
            {
                "id": agent,
                "role": role or None,
                **{name: stat(name, agent) for name in STAT_FIELDS},
            }
            for agent, role in sorted(agents.items())
        ]
        return {
            "id": unscoped(wid),
            "tenant": tenant_of(wid),
            "state": self._effective_state(s, view.last_active_at),
            "created_at": s.created_at,
            "last_active_at": view.last_active_at,
            "ended_at": s.ended_at,
            "ttl_s": s.ttl_s,
            "home_engine": view.home,
            "secondary_engines": [e for e in view.secondaries if e != view.home],
            "engines": {name: int(count) for name, count in sorted(engines.items())},
            "context_ids": [unscoped(c) for c in s.context_ids],
            "expected_fanout": s.expected_fanout,
            "shared_prefix_layout": s.shared_prefix_layout,
            "priority_scheduling": s.priority_scheduling,
            "service_tokens": float(stats.get("service_tokens", 0.0)),
            "agents": agent_rows,
            "requests": requests,
            "handoffs": handoffs,
            "totals": totals,
        }


def _float(value: str | None) -> float | None:
    return float(value) if value is not None else None
