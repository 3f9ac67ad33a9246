"""Which engine stores each Responses API response: the id -> engine map, in the state store.

vLLM keeps a stored response (`store`, the default) in the memory of the engine that made it;
a follow-up with `previous_response_id`, and a GET or cancel of the id, can only be answered
there. The router records `id -> engine` as soon as it sees the id (the non-streamed answer,
or the stream's first event, `response.created`) in the state store, so every router replica
that shares the store sends the follow-up to the same engine. Entries live `ttl_s` and at most
`max_ids` are kept (the oldest are dropped first); ids are scoped by tenant, so one tenant
cannot reach another's responses.
"""

from __future__ import annotations

import json
import re

from hiveroute.engines.engine import Engine
from hiveroute.engines.pool import EnginePool
from hiveroute.errors import HiverouteError, NotFound
from hiveroute.state.store import StateStore, all_of

PREFIX = "resp:"
ORDER_KEY = "resp-order"  # the recorded ids, oldest first (the bound)
DEFAULT_TTL_S = 24 * 3600.0
DEFAULT_MAX_IDS = 100_000
_FIRST_ID = re.compile(rb'"id"\s*:\s*"([A-Za-z0-9_.:-]{1,200})"')


def id_key(tenant: str | None, response_id: str) -> str:
    """The store key of a tenant's response id (a JSON pair: no id can name another tenant's)."""
    return PREFIX + json.dumps([tenant, response_id])


class ResponseEngineUnavailable(HiverouteError):
    """The engine that stores a response left the pool (410) or is unhealthy (409)."""

    error_type = "invalid_request_error"
    code = "response_engine_unavailable"

    def __init__(self, message: str, *, status: int, param: str) -> None:
        super().__init__(message, param=param)
        self.status = status


class ResponseIds:
    """The shared id -> engine map for stored responses (see the module docstring)."""

    def __init__(
        self,
        store: StateStore,
        pool: EnginePool,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_ids: int = DEFAULT_MAX_IDS,
    ) -> None:
        self.store = store
        self.pool = pool
        self.ttl_s = ttl_s
        self.max_ids = max_ids
        # ids the bound pushed out of the order, deleted with the next record's round trip
        self._dropped: list[str] = []

    async def record(self, tenant: str | None, response_id: str, engine: str) -> None:
        """Record the id before the client sees it (its follow-up may come at once), in one
        round trip: the first event of a streamed answer waits for it. The ids the bound
        drops are deleted with the next record (their TTL ends them anyway)."""
        key = id_key(tenant, response_id)
        dropped, self._dropped = self._dropped, []
        calls = [
            self.store.set_if_absent(key, engine, ttl_s=self.ttl_s),
            self.store.push_bounded(ORDER_KEY, key, self.max_ids),
        ]
        if dropped:
            calls.append(self.store.delete(*dropped))
        _, pushed_out, *_ = await all_of(self.store, *calls)
        self._dropped.extend(pushed_out)

    async def engine_of(self, tenant: str | None, response_id: str) -> str | None:
        return await self.store.get(id_key(tenant, response_id))

    async def home(self, tenant: str | None, response_id: str, param: str) -> str:
        """The engine that stores `response_id`, if it can serve now; else the 4xx that says
        why: 404 for an id this router never saw, 410/409 for an engine gone or unhealthy."""
        name = await self.engine_of(tenant, response_id)
        if name is None:
            raise NotFound(f"Response with id '{response_id}' not found.", param=param)
        engine: Engine | None = self.pool.get(name)
        if engine is None:
            raise ResponseEngineUnavailable(
                f"response '{response_id}' is stored on engine {name}, which has left the "
                "pool: it cannot be continued, read or cancelled; start a new conversation "
                "(send the whole input without previous_response_id)",
                status=410,
                param=param,
            )
        if not engine.healthy:
            raise ResponseEngineUnavailable(
                f"response '{response_id}' is stored on engine {name}, which is unhealthy "
                "now: try again when it recovers, or send the whole input without "
                "previous_response_id",
                status=409,
                param=param,
            )
        return name


def response_id_in(head: bytes, *, whole: bool) -> str | None:
    """The response id in an answer: a whole JSON body's `id`, or the first `"id"` of a
    stream's first event (`response.created` carries the response, whose first field is it)."""
    if whole:
        try:
            payload = json.loads(head)
        except (ValueError, RecursionError):
            return None
        found = payload.get("id") if isinstance(payload, dict) else None
        return found if isinstance(found, str) and found else None
    match = _FIRST_ID.search(head)
    return match.group(1).decode() if match else None
