"""The Redis state store: several router replicas share workflow state through one Redis.

Every operation goes to Redis, bounded by a short timeout (`timeout_s`), and is mirrored into a
local MemoryStateStore: writes go through to it, reads refresh it. When a call fails, times
out, or is refused for a reason of Redis's own (read-only after a failover, memory full), the
store switches to the local copy at once (one warning, `hiveroute_state_backend_up` 0) and
journals what it changes; requests never wait on a Redis that is gone. A probe writes a key
to Redis every `probe_s`; when that succeeds, the journal is merged back without overwriting what
other replicas wrote meanwhile (see journal.py and reconcile.py), then the store switches back
(one info line). If Redis lost its data meanwhile (restarted without persistence), the
replica's whole local copy is written back where keys are absent.

URL options, stripped before the URL goes to redis-py: `prefix` (key namespace, default
`hiveroute:`), `timeout_s` (per call, default 0.5) and `probe_s` (default 1.0), e.g.
``redis://redis:6379/0?prefix=prod:&timeout_s=0.2``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    ClusterDownError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from hiveroute.errors import ConfigError
from hiveroute.state import redis_scripts as lua
from hiveroute.state.autopipeline import AutoPipeline
from hiveroute.state.journal import DEFAULT_MAX_KEYS, Journal
from hiveroute.state.memory import MemoryStateStore
from hiveroute.state.reconcile import Reconciler
from hiveroute.state.redis_scripts import cas_args

if TYPE_CHECKING:
    from hiveroute.observability.metrics import StateMetrics

log = logging.getLogger("hiveroute.state")

T = TypeVar("T")

DEFAULT_PREFIX = "hiveroute:"
DEFAULT_TIMEOUT_S = 0.5
DEFAULT_PROBE_S = 1.0
SCAN_COUNT = 1000
MAX_SCAN_CALLS = 10_000
FAILURES = (RedisError, OSError, TimeoutError)
# Redis answered, but cannot keep this replica's state now: read-only (a replica after a
# failover), memory full, its master or cluster down, a slot busy, an ACL that no longer
# allows the commands. Raised, each was a 500 for every request that wrote; as good as down.
UNAVAILABLE = (ReadOnlyError, OutOfMemoryError, ClusterDownError, TryAgainError, NoPermissionError)


class BackendDown(Exception):
    """Redis did not answer in time: the caller serves this operation from local state."""


@dataclass(frozen=True)
class RedisOptions:
    url: str  # for redis-py, without our options
    display: str  # for logs: no credentials
    prefix: str = DEFAULT_PREFIX
    timeout_s: float = DEFAULT_TIMEOUT_S
    probe_s: float = DEFAULT_PROBE_S


def parse_redis_url(url: str) -> RedisOptions:
    split = urlsplit(url)
    if split.scheme not in ("redis", "rediss") or not split.hostname:
        raise ConfigError(f"state must be a redis://HOST[:PORT][/DB] URL, got {url!r}")
    ours: dict[str, str] = {}
    theirs: list[tuple[str, str]] = []
    for name, value in parse_qsl(split.query, keep_blank_values=True):
        if name in ("prefix", "timeout_s", "probe_s"):
            ours[name] = value
        else:
            theirs.append((name, value))

    def seconds(name: str, default: float, top: float) -> float:
        if name not in ours:
            return default
        try:
            value = float(ours[name])
        except ValueError:
            value = -1.0
        if not 0 < value <= top:
            raise ConfigError(f"state URL option {name} must be seconds in (0, {top:g}]")
        return value

    prefix = ours.get("prefix", DEFAULT_PREFIX)
    if len(prefix) > 128 or any(c.isspace() for c in prefix):
        raise ConfigError("state URL option prefix must be at most 128 characters, no spaces")
    port = split.port or 6379
    display = f"{split.scheme}://{split.hostname}:{port}{split.path or '/0'}"
    return RedisOptions(
        url=urlunsplit((split.scheme, split.netloc, split.path, urlencode(theirs), "")),
        display=display,
        prefix=prefix,
        timeout_s=seconds("timeout_s", DEFAULT_TIMEOUT_S, 60.0),
        probe_s=seconds("probe_s", DEFAULT_PROBE_S, 600.0),
    )


def px(ttl_s: float | None) -> int | None:
    return None if ttl_s is None else max(1, int(ttl_s * 1000))


def reason_of(exc: BaseException) -> str:
    return (
        "timeout"
        if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__
        else "connection"
    )


class RedisStateStore:
    """StateStore on Redis, with a local copy that serves while Redis is unreachable."""

    name = "redis"
    in_process = False

    def __init__(
        self,
        url: str,
        *,
        metrics: StateMetrics | None = None,
        journal_max_keys: int = DEFAULT_MAX_KEYS,
    ) -> None:
        self.options = parse_redis_url(url)
        self.prefix = self.options.prefix
        self.timeout_s = self.options.timeout_s
        self.redis: Any = aioredis.Redis.from_url(  # redis-py's stubs type replies loosely
            self.options.url,
            decode_responses=True,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        self.pipeline = AutoPipeline(self.redis)
        self.local = MemoryStateStore()
        self.journal = Journal(self.local, max_keys=journal_max_keys)
        self.metrics: StateMetrics | None = None
        self.up = True  # until a call fails
        self.up_since_outages = 0  # how many outages have ended: which up period a call began in
        self.down_since: float | None = None
        self.generation: str | None = None  # Redis' data generation when last seen up
        self._probe: asyncio.Task[None] | None = None
        self._closed = False
        self.scripts = {
            name: self.redis.register_script(getattr(lua, name))
            for name in (
                "COMPARE_AND_SET",
                "PUSH_BOUNDED",
                "MERGE_HASH",
                "RESTORE_HASH",
                "RESTORE_LIST",
            )
        }
        self.reconciler = Reconciler(self)
        if metrics is not None:
            self.bind_metrics(metrics)

    # --- lifecycle (a router component) ---------------------------------------------------

    def bind_metrics(self, metrics: StateMetrics) -> None:
        self.metrics = metrics
        metrics.backend_up.labels(self.name).set(1 if self.up else 0)

    async def start(self) -> None:
        await self.connect()

    async def connect(self) -> None:
        """Check Redis once (a router starts even when it is down) and note its generation."""
        try:
            self.generation = await self.raw(self.reconciler.generation)
        except FAILURES as exc:
            self._went_down(exc)
            return
        log.info("state: sharing state through Redis at %s", self.options.display)

    async def stop(self) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
            self._probe = None
        await self.pipeline.close()
        await self.redis.aclose()
        await self.local.close()

    # --- calls and the switch to local state ----------------------------------------------

    def k(self, key: str) -> str:
        return self.prefix + key

    async def raw(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        timeout_s: float | None = None,
        socket_bound: bool = False,
    ) -> T:
        """One bounded call to Redis; WRONGTYPE becomes TypeError like the memory store's.

        `socket_bound`: the call is a pipelined batch, which redis-py's socket timeouts
        (`timeout_s` to connect and for each reply) bound already."""
        try:
            if socket_bound:
                return await op()
            async with asyncio.timeout(timeout_s or self.timeout_s):
                return await op()
        except ResponseError as exc:
            if str(exc).startswith("WRONGTYPE"):
                raise TypeError(f"state key holds another type: {exc}") from None
            raise

    async def call(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        timeout_s: float | None = None,
        socket_bound: bool = False,
    ) -> T:
        """`raw`, or BackendDown at once while Redis is down (the caller goes local).

        A call that began before an outage which has since ended (it hung on a connection
        the outage left behind) is tried again: its failure says nothing of Redis now, and
        going down for it would start a second outage that nothing caused."""
        while True:
            if not self.up:
                if self.metrics is not None:
                    self.metrics.local_operations.labels(self.name).inc()
                raise BackendDown
            began_in = self.up_since_outages
            try:
                return await self.raw(op, timeout_s=timeout_s, socket_bound=socket_bound)
            except UNAVAILABLE as exc:
                failure: BaseException = exc
            except ResponseError:  # a mistake of the command's (WRONGTYPE, a script's)
                raise
            except FAILURES as exc:
                failure = exc
            if began_in != self.up_since_outages and self.up:
                self._count_error(failure)
                continue
            self._went_down(failure)
            raise BackendDown from None

    def _count_error(self, exc: BaseException) -> None:
        if self.metrics is not None:
            self.metrics.errors.labels(self.name, reason_of(exc)).inc()

    def _went_down(self, exc: BaseException) -> None:
        self._count_error(exc)
        if not self.up or self._closed:
            return
        self.up = False
        self.down_since = time.monotonic()
        self.pipeline.fail_pending(RedisConnectionError("Redis is unreachable"))
        if self.metrics is not None:
            self.metrics.backend_up.labels(self.name).set(0)
            self.metrics.local_operations.labels(self.name).inc()
        log.warning(
            "state: Redis at %s is unreachable (%s: %s); serving on this replica's local state "
            "until it returns",
            self.options.display,
            type(exc).__name__,
            str(exc) or f"no answer within {self.timeout_s:.2f} s",
        )
        self._probe = asyncio.get_running_loop().create_task(
            self._probe_loop(), name="redis-state-probe"
        )

    async def _probe_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.options.probe_s)
            try:
                # a write, not a PING: a Redis that answers but refuses writes (read-only after
                # a failover, memory full) is still down for this replica's state
                await self.raw(lambda: self.redis.set(self.k("probe"), "1", px=60_000))
                summary = await self.reconciler.run()
            except FAILURES as exc:
                self._count_error(exc)
                continue
            except Exception:  # a bug must not keep the replica off Redis for good
                log.exception("state: reconciling with Redis failed; its local changes are lost")
                self.journal.clear()
                summary = "reconciliation failed"
            self.up = True  # no await since the journal was found empty
            self.up_since_outages += 1
            self._probe = None
            outage = time.monotonic() - (self.down_since or time.monotonic())
            if self.metrics is not None:
                self.metrics.backend_up.labels(self.name).set(1)
            log.info(
                "state: Redis at %s is back after %.1f s; %s",
                self.options.display,
                outage,
                summary,
            )
            return

    # --- strings --------------------------------------------------------------------------

    async def queued(self, add: Callable[[Any], Any], n: int = 1) -> Any:
        """`n` commands that `add` queues on a pipeline, sent with concurrent callers' ones."""
        return await self.call(lambda: self.pipeline.run(add, n), socket_bound=True)

    async def script(self, name: str, key: str, args: list[Any]) -> Any:
        """Run a Lua script by its SHA in the shared pipeline (loading it if Redis lacks it)."""
        sha = self.scripts[name].sha
        try:
            return await self.queued(lambda p: p.evalsha(sha, 1, self.k(key), *args))
        except NoScriptError:  # a Redis that restarted: load it once, then run it
            return await self.call(lambda: self.scripts[name](keys=[self.k(key)], args=args))

    async def _mirror_string(self, key: str, value: str | None, pttl: int) -> None:
        if value is None:
            await self.local.delete(key)
        else:
            await self.local.set(key, value, ttl_s=pttl / 1000 if pttl > 0 else None)

    async def get(self, key: str) -> str | None:
        k = self.k(key)
        try:
            value, pttl = await self.queued(lambda p: p.get(k).pttl(k), 2)
        except BackendDown:
            return await self.local.get(key)
        await self._mirror_string(key, value, pttl)
        return value

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        try:
            await self.queued(lambda p: p.set(self.k(key), value, px=px(ttl_s)))
        except BackendDown:
            self.journal.string(key)
        await self.local.set(key, value, ttl_s=ttl_s)

    async def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> bool:
        try:
            done = bool(
                await self.queued(lambda p: p.set(self.k(key), value, nx=True, px=px(ttl_s)))
            )
        except BackendDown:
            self.journal.string(key)
            return await self.local.set_if_absent(key, value, ttl_s=ttl_s)
        if done:
            await self.local.set(key, value, ttl_s=ttl_s)
        return done

    async def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> bool:
        try:
            done = bool(
                await self.script("COMPARE_AND_SET", key, cas_args(expected, value, px(ttl_s)))
            )
        except BackendDown:
            self.journal.string(key)
            return await self.local.compare_and_set(key, expected, value, ttl_s=ttl_s)
        if done:
            await self.local.set(key, value, ttl_s=ttl_s)
        return done

    async def delete(self, *keys: str) -> int:
        if not keys:
            return 0
        try:
            removed: int = await self.queued(lambda p: p.delete(*map(self.k, keys)))
        except BackendDown:
            for key in keys:
                self.journal.deleted(key)
            return await self.local.delete(*keys)
        await self.local.delete(*keys)
        return removed

    async def expire(self, key: str, ttl_s: float | None) -> bool:
        k = self.k(key)
        try:
            if ttl_s is None:
                exists, _ = await self.queued(lambda p: p.exists(k).persist(k), 2)
                found = bool(exists)
            else:
                found = bool(await self.queued(lambda p: p.pexpire(k, px(ttl_s))))
        except BackendDown:
            self.journal.renewed(key)
            return await self.local.expire(key, ttl_s)
        await self.local.expire(key, ttl_s)
        return found

    async def scan(self, prefix: str, *, limit: int = 10_000) -> list[str]:
        pattern = self.k(_glob_escape(prefix)) + "*"
        skip = len(self.prefix)

        async def op() -> list[str]:
            found: list[str] = []
            cursor: int = 0
            for _ in range(MAX_SCAN_CALLS):
                cursor, keys = await self.redis.scan(cursor, match=pattern, count=SCAN_COUNT)
                found.extend(key[skip:] for key in keys if key[skip:] != self.reconciler.marker)
                if cursor == 0 or len(found) >= limit:
                    break
            return list(dict.fromkeys(found))[:limit]  # SCAN may return a key twice

        try:
            return await self.call(op, timeout_s=4 * self.timeout_s)
        except BackendDown:
            return await self.local.scan(prefix, limit=limit)

    # --- hashes ---------------------------------------------------------------------------

    async def hget(self, key: str, field: str) -> str | None:
        try:
            value: str | None = await self.queued(lambda p: p.hget(self.k(key), field))
        except BackendDown:
            return await self.local.hget(key, field)
        if isinstance(
            self.local.entry(key, copy=False)[0], dict
        ):  # refresh a hash mirrored already
            if value is None:
                await self.local.hdel(key, field)
            else:
                await self.local.hset(key, {field: value})
        return value

    async def hgetall(self, key: str) -> dict[str, str]:
        k = self.k(key)
        try:
            mapping, pttl = await self.queued(lambda p: p.hgetall(k).pttl(k), 2)
        except BackendDown:
            return await self.local.hgetall(key)
        await self.mirror_hash(key, mapping, pttl)
        return dict(mapping)

    async def mirror_hash(self, key: str, mapping: dict[str, str], pttl: int) -> None:
        await self.local.delete(key)
        if mapping:
            await self.local.hset(key, dict(mapping))
            if pttl > 0:
                await self.local.expire(key, pttl / 1000)

    async def hset(self, key: str, mapping: dict[str, str]) -> None:
        if not mapping:
            return
        try:
            await self.queued(lambda p: p.hset(self.k(key), mapping=mapping))
        except BackendDown:
            self.journal.fields(key, list(mapping))
        await self.local.hset(key, mapping)

    async def hdel(self, key: str, *fields: str) -> int:
        if not fields:
            return 0
        try:
            removed: int = await self.queued(lambda p: p.hdel(self.k(key), *fields))
        except BackendDown:
            self.journal.fields(key, list(fields))
            return await self.local.hdel(key, *fields)
        await self.local.hdel(key, *fields)
        return removed

    async def hincrby(self, key: str, field: str, amount: int = 1) -> int:
        try:
            value = int(await self.queued(lambda p: p.hincrby(self.k(key), field, amount)))
        except BackendDown:
            self.journal.increment(key, field, amount, is_float=False)
            return await self.local.hincrby(key, field, amount)
        await self.local.hset(key, {field: str(value)})
        return value

    async def hincrby_many(self, key: str, increments: dict[str, int]) -> dict[str, int]:
        if not increments:
            return {}
        k = self.k(key)
        items = list(increments.items())

        def add(p: Any) -> Any:
            for field, amount in items:
                p.hincrby(k, field, amount)
            return p

        try:
            replies = await self.queued(add, len(items))
        except BackendDown:
            for field, amount in items:
                self.journal.increment(key, field, amount, is_float=False)
            return await self.local.hincrby_many(key, increments)
        if len(items) == 1:  # one command: its reply, not a list of one
            replies = [replies]
        values = {field: int(reply) for (field, _), reply in zip(items, replies, strict=True)}
        await self.local.hset(key, {field: str(value) for field, value in values.items()})
        return values

    async def hincrbyfloat(self, key: str, field: str, amount: float) -> float:
        try:
            value = float(await self.queued(lambda p: p.hincrbyfloat(self.k(key), field, amount)))
        except BackendDown:
            self.journal.increment(key, field, amount, is_float=True)
            return await self.local.hincrbyfloat(key, field, amount)
        await self.local.hset(key, {field: repr(value)})
        return value

    # --- bounded lists --------------------------------------------------------------------

    async def push_bounded(self, key: str, value: str, max_len: int) -> list[str]:
        if max_len <= 0:
            raise ValueError("max_len must be positive")
        try:
            dropped = await self.script("PUSH_BOUNDED", key, [max_len, value])
        except BackendDown:
            self.journal.push(key, value, max_len)
            return await self.local.push_bounded(key, value, max_len)
        await self.local.push_bounded(key, value, max_len)
        return list(dropped)

    async def lrange(self, key: str, start: int = 0, stop: int = -1) -> list[str]:
        try:
            values: list[str] = await self.queued(lambda p: p.lrange(self.k(key), start, stop))
        except BackendDown:
            return await self.local.lrange(key, start, stop)
        return values


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
