"""The shared-context registry: named blocks of text, global or scoped to one workflow.

Contexts are immutable (re-registering an id with other text is a conflict), so a replica may
cache them locally; the cache is bounded and re-checked against the store every `cache_s`, so
a context deleted through another replica disappears within that time.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from hiveroute.errors import BadRequest, Conflict, NotFound, PayloadTooLarge, TooManyRequests
from hiveroute.state.store import StateStore, dumps, get_json
from hiveroute.workflows.scope import scoped, unscoped, visible

PREFIX = "ctx:doc:"
CACHE_ENTRIES = 1024


@dataclass(frozen=True)
class SharedContext:
    id: str
    text: str
    workflow_id: str | None
    name: str | None
    bytes: int
    tokens: int
    created_at: float

    def to_json(self, *, with_text: bool = False) -> dict[str, Any]:
        """The API view: ids without their tenant scope."""
        data = asdict(self)
        data["id"] = unscoped(self.id)
        data["workflow_id"] = unscoped(self.workflow_id) if self.workflow_id else None
        if not with_text:
            data.pop("text")
        return data


class ContextRegistry:
    def __init__(
        self,
        store: StateStore,
        count_tokens: Callable[[str], int],
        *,
        max_bytes: int = 1024 * 1024,
        max_contexts: int = 1000,
        cache_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.count_tokens = count_tokens
        self.max_bytes = max_bytes
        self.max_contexts = max_contexts
        self.cache_s = cache_s
        self.clock = clock
        self._cache: OrderedDict[str, tuple[float, SharedContext]] = OrderedDict()

    async def register(
        self, body: dict[str, Any], tenant: str | None = None
    ) -> tuple[SharedContext, bool]:
        """POST /v1/contexts: the context and whether it is new or the same again."""
        from hiveroute.workflows.registry import check_id

        unknown = sorted(set(body) - {"id", "text", "workflow_id", "name"})
        if unknown:
            raise BadRequest(
                f"unknown field(s): {', '.join(unknown)}; known: id, name, text, workflow_id"
            )
        text = body.get("text")
        if not isinstance(text, str) or not text:
            raise BadRequest("'text' must be a non-empty string", param="text")
        size = len(text.encode())
        if size > self.max_bytes:
            raise PayloadTooLarge(
                f"context is {size} bytes; the limit is {self.max_bytes} (context_max_bytes)",
                param="text",
            )
        local_id = body.get("id") or f"ctx-{secrets.token_hex(8)}"
        check_id(local_id, "'id'")
        context_id = scoped(tenant, local_id)
        workflow_id = body.get("workflow_id")
        if workflow_id is not None:
            workflow_id = scoped(tenant, check_id(workflow_id, "'workflow_id'"))
        name = body.get("name")
        if name is not None and (not isinstance(name, str) or len(name) > 256):
            raise BadRequest("'name' must be a string of at most 256 characters", param="name")
        existing = await self.get(context_id, required=False)
        if existing is not None:
            return self._again(existing, local_id, text, workflow_id)
        if len(await self.store.scan(PREFIX, limit=self.max_contexts + 1)) >= self.max_contexts:
            raise TooManyRequests(
                f"the router holds {self.max_contexts} contexts (context_max_count); "
                "delete some with DELETE /v1/contexts/{id}",
                retry_after_s=5.0,
            )
        context = SharedContext(
            id=context_id,
            text=text,
            workflow_id=workflow_id,
            name=name,
            bytes=size,
            tokens=self.count_tokens(text),
            created_at=self.clock(),
        )
        # set only if absent: of two registrations of one id at once, one writes; the other
        # is the same again, or a conflict (contexts are immutable), as if it came second
        if not await self.store.set_if_absent(PREFIX + context_id, dumps(asdict(context))):
            meanwhile = await self.get(context_id, required=False)
            return self._again(meanwhile, local_id, text, workflow_id)
        self._remember(context)
        return context, True

    @staticmethod
    def _again(
        existing: SharedContext | None, local_id: str, text: str, workflow_id: str | None
    ) -> tuple[SharedContext, bool]:
        """A context registered again: the same one (not new), or a conflict."""
        if existing is None or existing.text != text or existing.workflow_id != workflow_id:
            raise Conflict(
                f"context {local_id!r} exists with different text or scope; "
                "contexts are immutable: register a new id",
                param="id",
            )
        return existing, False

    def _remember(self, context: SharedContext) -> None:
        self._cache[context.id] = (self.clock(), context)
        self._cache.move_to_end(context.id)
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)

    async def get(self, context_id: str, *, required: bool = True) -> SharedContext | None:
        cached = self._cache.get(context_id)
        if cached is not None and self.clock() - cached[0] <= self.cache_s:
            return cached[1]
        doc = await get_json(self.store, PREFIX + context_id)
        if doc is None:
            self._cache.pop(context_id, None)
            if required:
                raise NotFound(f"no context {unscoped(context_id)!r}", code="context_not_found")
            return None
        context = SharedContext(**doc)
        self._remember(context)
        return context

    async def list(
        self, workflow_id: str | None = None, *, tenant: str | None = None
    ) -> list[SharedContext]:
        """Contexts `tenant` may see (None: all), of one workflow (scoped id) if given."""
        found = []
        for key in await self.store.scan(PREFIX, limit=self.max_contexts):
            context_id = key[len(PREFIX) :]
            if not visible(context_id, tenant):
                continue
            context = await self.get(context_id, required=False)
            if context is not None and (workflow_id is None or context.workflow_id == workflow_id):
                found.append(context)
        found.sort(key=lambda c: (c.created_at, c.id))
        return found

    async def delete(self, context_id: str) -> bool:
        self._cache.pop(context_id, None)
        return await self.store.delete(PREFIX + context_id) > 0

    async def delete_workflow(self, workflow_id: str) -> None:
        """Drop a workflow's own contexts (DELETE /v1/workflows/{id}: it ended)."""
        for context in await self.list(workflow_id):
            await self.delete(context.id)
