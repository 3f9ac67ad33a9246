"""The state-store interface: what several router replicas must agree on.

Workflow records and their home engines, shared contexts, session affinity and speculative
index entries live here. The operations are the ones Redis offers cheaply, so a Redis store is
a thin mapping (GET/SET NX PX, WATCH or a Lua CAS, HSET/HINCRBY, RPUSH+LTRIM, SCAN):

- string values with an optional TTL; `set_if_absent` and `compare_and_set` decide races such
  as two replicas choosing a workflow's home engine (both read back the winner);
- hashes of string fields, with integer and float increments (counters replicas share);
- bounded lists (the most recent N entries; pushing reports what fell off).

Values are strings; JSON documents go through `get_json`/`set_json`. Keys are namespaced by
their users (``wf:``, ``ctx:``, ...). Every key may carry a TTL; `expire` renews it.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
from collections.abc import Awaitable
from typing import Any, Protocol

from hiveroute.errors import ConfigError


class StateStore(Protocol):
    """Async key/value, hash and bounded-list store with TTLs (memory or Redis)."""

    name: str
    # Calls finish without waiting on another process (they never suspend): independent calls
    # are then awaited one by one; a remote store's are sent together (`all_of`).
    in_process: bool

    # strings ------------------------------------------------------------------------------
    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None: ...

    async def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> bool:
        """Set `key` only if it does not exist; True if this call set it."""
        ...

    async def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> bool:
        """Set `key` to `value` only if it currently holds `expected` (None: absent)."""
        ...

    async def delete(self, *keys: str) -> int: ...

    async def expire(self, key: str, ttl_s: float | None) -> bool:
        """Renew (or with None, remove) a key's TTL; False if the key does not exist."""
        ...

    async def scan(self, prefix: str, *, limit: int = 10_000) -> list[str]:
        """Keys starting with `prefix` (at most `limit`)."""
        ...

    # hashes -------------------------------------------------------------------------------
    async def hget(self, key: str, field: str) -> str | None: ...

    async def hgetall(self, key: str) -> dict[str, str]: ...

    async def hset(self, key: str, mapping: dict[str, str]) -> None: ...

    async def hdel(self, key: str, *fields: str) -> int: ...

    async def hincrby(self, key: str, field: str, amount: int = 1) -> int: ...

    async def hincrbyfloat(self, key: str, field: str, amount: float) -> float: ...

    # bounded lists ------------------------------------------------------------------------
    async def push_bounded(self, key: str, value: str, max_len: int) -> list[str]:
        """Append `value`, keep the last `max_len` entries, return those that fell off."""
        ...

    async def lrange(self, key: str, start: int = 0, stop: int = -1) -> list[str]: ...

    # lifecycle ----------------------------------------------------------------------------
    async def close(self) -> None: ...


async def get_json(store: StateStore, key: str) -> Any:
    raw = await store.get(key)
    return None if raw is None else json.loads(raw)


async def set_json(store: StateStore, key: str, value: Any, *, ttl_s: float | None = None) -> None:
    await store.set(key, dumps(value), ttl_s=ttl_s)


async def all_of(store: StateStore, *calls: Awaitable[Any]) -> list[Any]:
    """The results of independent calls to `store`: sent together to a remote store (one
    round trip, pipelined), awaited in turn on an in-process one, where tasks would only add
    event-loop turns to the request."""
    if not store.in_process:
        return list(await asyncio.gather(*calls))
    results = []
    for i, call in enumerate(calls):
        try:
            results.append(await call)
        except BaseException:
            for rest in calls[i + 1 :]:  # as gather would, leave no call unawaited
                if inspect.iscoroutine(rest):
                    rest.close()
            raise
    return results


def dumps(value: Any) -> str:
    """Compact JSON, the one encoding every store value uses."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def open_state_store(url: str) -> StateStore:
    """The store named by config key `state`: 'memory', or a redis:// URL."""
    if url in ("", "memory"):
        from hiveroute.state.memory import MemoryStateStore

        return MemoryStateStore()
    if url.startswith(("redis://", "rediss://")):
        from hiveroute.extras import require

        require("redis", "redis")
        try:
            module = importlib.import_module("hiveroute.state.redis")
        except ImportError as exc:
            raise ConfigError(
                f"state: the Redis state store cannot be loaded ({exc}); use 'memory'"
            ) from None
        store: StateStore = module.RedisStateStore(url)
        return store
    raise ConfigError(f"state must be 'memory' or a redis:// URL, got {url!r}")
