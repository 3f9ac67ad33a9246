"""The state-store interface: what several router replicas must agree on.

Workflow records and their home engines, shared contexts, response-id affinity and shared
counters live here. The KV index does not: each replica (and each worker) keeps its own, fed by
the engines' events, with its own speculative entries.

The operations are the ones Redis offers cheaply, so a Redis store is a thin mapping (GET/SET
NX PX, WATCH or a Lua CAS, HSET/HINCRBY, RPUSH+LTRIM, SCAN):

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
from collections.abc import Awaitable
from typing import Any, Protocol

import orjson

from hiveroute.errors import ConfigError


class StateStore(Protocol):
    """Async key/value, hash and bounded-list store with TTLs (memory or Redis).

    Each operation returns an awaitable: a coroutine (memory, Redis) or a future already sent
    (the shared store of `serve --workers`)."""

    name: str
    # Calls finish without waiting on another process (they never suspend): independent calls
    # are then awaited one by one; a remote store's are sent together (`all_of`).
    in_process: bool

    # strings ------------------------------------------------------------------------------
    def get(self, key: str) -> Awaitable[str | None]: ...

    def set(self, key: str, value: str, *, ttl_s: float | None = None) -> Awaitable[None]: ...

    def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> Awaitable[bool]:
        """Set `key` only if it does not exist; True if this call set it."""
        ...

    def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> Awaitable[bool]:
        """Set `key` to `value` only if it currently holds `expected` (None: absent)."""
        ...

    def delete(self, *keys: str) -> Awaitable[int]: ...

    def expire(self, key: str, ttl_s: float | None) -> Awaitable[bool]:
        """Renew (or with None, remove) a key's TTL; False if the key does not exist."""
        ...

    def scan(self, prefix: str, *, limit: int = 10_000) -> Awaitable[list[str]]:
        """Keys starting with `prefix` (at most `limit`)."""
        ...

    # hashes -------------------------------------------------------------------------------
    def hget(self, key: str, field: str) -> Awaitable[str | None]: ...

    def hgetall(self, key: str) -> Awaitable[dict[str, str]]: ...

    def hset(self, key: str, mapping: dict[str, str]) -> Awaitable[None]: ...

    def hdel(self, key: str, *fields: str) -> Awaitable[int]: ...

    def hincrby(self, key: str, field: str, amount: int = 1) -> Awaitable[int]: ...

    def hincrby_many(self, key: str, increments: dict[str, int]) -> Awaitable[dict[str, int]]:
        """`hincrby` of several fields of one hash in one call (a request's counters: one
        message to a shared store, not one each); each field's new value."""
        ...

    def hincrbyfloat(self, key: str, field: str, amount: float) -> Awaitable[float]: ...

    # bounded lists ------------------------------------------------------------------------
    def push_bounded(self, key: str, value: str, max_len: int) -> Awaitable[list[str]]:
        """Append `value`, keep the last `max_len` entries, return those that fell off."""
        ...

    def lrange(self, key: str, start: int = 0, stop: int = -1) -> Awaitable[list[str]]: ...

    # lifecycle ----------------------------------------------------------------------------
    def close(self) -> Awaitable[None]: ...


async def get_json(store: StateStore, key: str) -> Any:
    raw = await store.get(key)
    return None if raw is None else loads(raw)


async def set_json(store: StateStore, key: str, value: Any, *, ttl_s: float | None = None) -> None:
    await store.set(key, dumps(value), ttl_s=ttl_s)


async def all_of(store: StateStore, *calls: Awaitable[Any]) -> list[Any]:
    """The results of independent calls to `store`, sent together to a remote store (one
    round trip, pipelined). Awaited in turn when that costs no round trips: on an in-process
    store (its calls never suspend: tasks would only add event-loop turns to the request), and
    when every call is already in flight (a shared store's calls are futures, sent when made:
    `gather` would add a callback per call and no speed)."""
    if not store.in_process and not all(isinstance(call, asyncio.Future) for call in calls):
        return list(await asyncio.gather(*calls))
    results = []
    for i, call in enumerate(calls):
        try:
            results.append(await call)
        except BaseException:
            for rest in calls[i + 1 :]:  # as gather would, leave no call unawaited
                if inspect.iscoroutine(rest):
                    rest.close()
                elif isinstance(rest, asyncio.Future):
                    rest.add_done_callback(_retrieve)
            raise
    return results


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a call's failure as seen: the first failure of `all_of` is the one raised."""
    if not future.cancelled():
        future.exception()


def dumps(value: Any) -> str:
    """Compact JSON, the one encoding every store value uses (orjson: a request's records are
    written and read a few times each, at a tenth of the standard library's cost)."""
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def loads(raw: str | bytes) -> Any:
    """A store value's JSON, read back (`dumps`' twin)."""
    return orjson.loads(raw)


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
