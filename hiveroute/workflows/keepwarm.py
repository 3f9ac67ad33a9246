"""Keep-warm and pre-warm: keep a workflow's shared prefix resident on its home engine(s).

Between steps (no request of the workflow in flight, e.g. its agents wait on tools) a prefix
unused for `keep_warm_idle_s` is at risk of eviction under load. Each round, such prefixes are
re-touched on the workflow's home and spill engines: with a retention hint where the engine
supports one (the simulator's POST /sim/retain pins the blocks for `keep_warm_retention_s`),
else with a one-token request (max_tokens=1) that refreshes the blocks' recency. All of it
within a budget of `keep_warm_max_rps` requests per second (a token bucket). A workflow stops
being kept warm when it ends or expires; its retention pins are released then.

Pins never hold memory back from real work: on an engine whose cache (pins included) is fuller
than `keep_warm_max_kv_usage` no pin is placed or renewed (they lapse by themselves) and the
prefix is touched instead, which only refreshes its recency. A workflow idle for more than
`keep_warm_max_idle_s` (far longer than a tool call: probably done) is let go, its pins released.

Only workflows placed by the `workflow` policy have home engines, so other policies never
trigger keep-warm. Pre-warm: a registered context is prefilled on the home engine before the
first agent asks (`prewarm`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from hiveroute.engines.client import EngineClient
from hiveroute.engines.engine import Engine
from hiveroute.engines.pool import EnginePool
from hiveroute.workflows.scope import tenant_of

if TYPE_CHECKING:
    from hiveroute.workflows.registry import WorkflowView
    from hiveroute.workflows.service import WorkflowService

log = logging.getLogger("hiveroute.workflows.keepwarm")

MAX_TASKS = 64
MAX_PREFIX_HINTS = 1024


@dataclass
class PrefixHint:
    """A prefix a client said it will reuse (Anthropic's `cache_control`): kept warm on the
    engine that served it until `until`, by a one-token request on `path` with `body`."""

    engine: str
    path: str
    body: dict[str, Any]
    until: float
    last: float  # last used or warmed


class TokenBucket:
    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self.tokens = self.burst
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def warm_body(
    view: WorkflowView, text: str, model: str | None, *, chat: bool, salt: str | None = None
) -> dict[str, Any]:
    """A one-token request for `text`; `salt`: the cache_salt its tenant's requests carry
    (blocks of one prefix under another salt are other blocks: unsalted, it would warm
    blocks no agent of the workflow uses)."""
    body: dict[str, Any] = {"max_tokens": 1, "stream": False}
    if model is not None:
        body["model"] = model
    if salt is not None:
        body["cache_salt"] = salt
    if chat:
        body["messages"] = [{"role": "system", "content": text}]
    else:
        body["prompt"] = text
    return body


class KeepWarm:
    def __init__(
        self,
        service: WorkflowService,
        pool: EnginePool,
        client: EngineClient,
        cache_salt: Callable[[str], str] | None = None,
    ) -> None:
        self.service = service
        self.pool = pool
        self.client = client  # the engine's key and timeouts, as on every engine request
        # a tenant's salt, as its requests carry it (gateway/auth.py); None: no tenants
        self.cache_salt = cache_salt
        config = service.config
        self.interval_s: float = config.keep_warm_interval_s
        self.idle_s: float = config.keep_warm_idle_s
        self.retention_s: float = config.keep_warm_retention_s
        self.max_idle_s: float = config.keep_warm_max_idle_s
        self.max_kv_usage: float = config.keep_warm_max_kv_usage
        self.stale_after_s: float = config.request_timeout_s + 60.0
        self.bucket = TokenBucket(config.keep_warm_max_rps)
        self.retain_supported: dict[str, bool] = {}  # engine -> does it take /sim/retain
        self.retained: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {}  # wf -> engine -> hint
        self.sent = 0
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self.hints: collections.OrderedDict[tuple[str, str], PrefixHint] = collections.OrderedDict()

    def under_pressure(self, engine: Engine) -> bool:
        """An engine whose cache (pins included) is fuller than `keep_warm_max_kv_usage` needs
        its memory for requests: no blocks are pinned there (pins lapse on their own); a touch
        only refreshes recency, which never holds memory back from a request."""
        return engine.load.kv_usage >= self.max_kv_usage

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0 and self.bucket.rate > 0

    async def start(self) -> None:
        if self.enabled:
            self._task = asyncio.create_task(self._loop(), name="keep-warm")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for task in list(self._inflight):
            task.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def drain(self) -> None:
        """Wait for the warm requests already launched (tests, shutdown of one workflow)."""
        for _ in range(10):
            if not self._inflight:
                return
            await asyncio.gather(*list(self._inflight), return_exceptions=True)

    def forget(self, workflow_id: str) -> None:
        """The workflow ended or expired: release its retention pins, warm it no more."""
        hints = self.retained.pop(workflow_id, {})
        for engine_name, (path, body) in hints.items():
            self._launch(self._retain(engine_name, path, {**body, "seconds": 0}, "release"))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.round()
            except Exception:
                log.exception("keep-warm round failed")

    def hint(self, engine: str, path: str, body: dict[str, Any], ttl_s: float, key: str) -> None:
        """Keep `body`'s prefix warm on `engine` for `ttl_s` (renewed by each use; the oldest
        of more than MAX_PREFIX_HINTS is dropped). `key` names the prefix."""
        now = time.monotonic()
        self.hints.pop((engine, key), None)
        self.hints[(engine, key)] = PrefixHint(engine, path, body, now + ttl_s, now)
        while len(self.hints) > MAX_PREFIX_HINTS:
            self.hints.popitem(last=False)

    def _warm_hints(self, now: float) -> int:
        """Touch each hinted prefix idle for `keep_warm_idle_s`, within the shared budget."""
        launched = 0
        for key, hint in list(self.hints.items()):
            if now >= hint.until:
                del self.hints[key]
                continue
            engine = self.pool.get(hint.engine)
            if engine is None or not engine.healthy or now - hint.last < self.idle_s:
                continue
            if len(self._inflight) >= MAX_TASKS or not self.bucket.take():
                break
            hint.last = now
            self._launch(self._send(engine, hint.path, hint.body, "cache_control"))
            launched += 1
        return launched

    def round(self, now: float | None = None) -> int:
        """One pass over active workflows and hinted prefixes; returns how many warm
        requests it launched."""
        now = time.monotonic() if now is None else now
        launched = self._warm_hints(now)
        for view in self.service.registry.active_views():
            if not view.engines or view.busy(now, self.stale_after_s):
                continue
            text = view.warm_text
            if text is None or len(text) < 256:
                continue
            last_active = max(view.last_used.values(), default=0.0)
            if last_active and now - last_active > self.max_idle_s:
                # idle far longer than a tool call: likely done; let the engines have the memory
                if view.id in self.retained:
                    self.forget(view.id)
                continue
            for name in view.engines:
                engine = self.pool.get(name)
                if engine is None or not engine.healthy:
                    continue
                last = max(view.last_used.get(name, 0.0), view.warmed_at.get(name, 0.0))
                retaining = (
                    self.retain_supported.get(name)
                    and name in self.retained.get(view.id, {})
                    and not self.under_pressure(engine)
                )
                wait = max(self.idle_s, self.retention_s / 2) if retaining else self.idle_s
                if now - last < wait:
                    continue
                if len(self._inflight) >= MAX_TASKS or not self.bucket.take():
                    return launched
                view.warmed_at[name] = now
                self._launch(self.warm(view, engine, text))
                launched += 1
        return launched

    def _launch(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    def _salt(self, view: WorkflowView) -> str | None:
        tenant = tenant_of(view.id)
        return None if tenant is None or self.cache_salt is None else self.cache_salt(tenant)

    def _model(self, view: WorkflowView, engine: Engine) -> str | None:
        if view.model is not None:
            return view.model
        return min(engine.models) if engine.models else None

    async def warm(self, view: WorkflowView, engine: Engine, text: str) -> None:
        """Retention hint if the engine takes one, else a one-token request."""
        chat = view.path is None or view.path.endswith("/chat/completions")
        body = warm_body(view, text, self._model(view, engine), chat=chat, salt=self._salt(view))
        if self.retain_supported.get(engine.name) is not False and not self.under_pressure(engine):
            kept = ("messages", "prompt", "model", "cache_salt")
            hint = {k: v for k, v in body.items() if k in kept}
            pinned = await self._retain(
                engine.name, "/sim/retain", {**hint, "seconds": self.retention_s}, "retain"
            )
            if pinned:
                self.retained.setdefault(view.id, {})[engine.name] = ("/sim/retain", hint)
                return
            # nothing pinned (the prefix was evicted, or no hint support): prefill it again
        path = "/v1/chat/completions" if chat else "/v1/completions"
        await self._send(engine, path, body, "touch")

    async def _retain(self, engine_name: str, path: str, body: dict[str, Any], kind: str) -> bool:
        """Send a retention hint; True if the engine pinned some of the prefix."""
        engine = self.pool.get(engine_name)
        if engine is None:
            return False
        try:
            status, answer = await self.client.post_json(engine, path, body)
            if status in (404, 405):
                self.retain_supported[engine_name] = False
                return False
            ok = status < 400
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("retention hint to %s failed: %s", engine_name, exc)
            ok, answer = False, None
        if ok:
            self.retain_supported[engine_name] = True
        self.sent += 1
        self.service.metrics.keep_warm.labels(engine_name, kind, "ok" if ok else "error").inc()
        pinned = answer.get("pinned_tokens", 0) if isinstance(answer, dict) else 0
        return bool(ok and isinstance(pinned, int) and pinned > 0)

    async def _send(self, engine: Engine, path: str, body: dict[str, Any], kind: str) -> bool:
        try:
            status, _ = await self.client.post_json(engine, path, body)
            ok = status < 400
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("%s request to %s failed: %s", kind, engine.name, exc)
            ok = False
        self.sent += 1
        self.service.metrics.keep_warm.labels(engine.name, kind, "ok" if ok else "error").inc()
        return ok

    async def prewarm(self, view: WorkflowView, engine: Engine, text: str) -> bool:
        """Prefill `text` (the workflow's shared prefix) on `engine` before agents ask."""
        if not self.enabled:
            return False
        chat = view.path is None or view.path.endswith("/chat/completions")
        body = warm_body(view, text, self._model(view, engine), chat=chat, salt=self._salt(view))
        path = "/v1/chat/completions" if chat else "/v1/completions"
        view.warmed_at[engine.name] = time.monotonic()
        return await self._send(engine, path, body, "prewarm")
