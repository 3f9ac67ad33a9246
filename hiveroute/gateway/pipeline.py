"""RequestPipeline: one request from parsed to finished, in the shape of llm-d's Director.

The handler does HTTP only (read, parse, metadata) and hands the pipeline a way to parse; the
pipeline admits the request, runs the request hooks, prepares the policy, then for each attempt
takes the candidate engines once, chooses, sends (retrying once elsewhere when an engine cannot
be reached) and relays the answer. Whatever happens (an answer, a refusal, no engine, a filter
that empties the candidates, a failed `prepare`, a client that goes away), one `finally`
finishes the request: the policy hears how it went, every hook that saw it gets
`after_complete`, the metrics are counted, the span ends and one access-log line is written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from aiohttp import web

from hiveroute.engines.client import EngineClient, EngineUnreachable, UpstreamAnswer
from hiveroute.engines.engine import Engine
from hiveroute.engines.pool import EnginePool
from hiveroute.errors import (
    HiverouteError,
    NoEngineAvailable,
    NotFound,
    TooManyRequests,
    UpstreamError,
)
from hiveroute.gateway.access_log import access_log_enabled, log_request
from hiveroute.gateway.admission import AdmissionController
from hiveroute.gateway.apis import CHAT, Api
from hiveroute.gateway.proxy import RelayResult, relay_stream, relay_whole, upstream_headers
from hiveroute.gateway.request_ids import NO_ENGINE, endpoint_label, mark_finished, status_class
from hiveroute.gateway.usage import Usage
from hiveroute.observability.metrics import RouterMetrics
from hiveroute.observability.tracing import RequestSpan
from hiveroute.routing.base import CycleState, Decision, RequestOutcome, RoutingRequest
from hiveroute.routing.cost import PRICES_KEY, prices_for_log
from hiveroute.routing.policy import Policy

log = logging.getLogger("hiveroute.gateway")


class RequestHook(Protocol):
    """Sees every request before routing and after it ends, whatever its end.

    `before_route` may replace `request.body` (a new dict, never mutated in place) to rewrite
    what the engine receives, or raise a HiverouteError to refuse the request. `after_complete`
    runs for every request whose `before_route` was called, refused ones included (their
    outcome has no engine).
    """

    async def before_route(self, request: RoutingRequest) -> None: ...

    def after_complete(self, request: RoutingRequest, outcome: RequestOutcome) -> None: ...


class ServedHook:
    """A request hook that tells `served` the name of each engine that answered a request
    (the KV event service: an engine that served requests owes KV events)."""

    def __init__(self, served: Callable[[str], None]) -> None:
        self.served = served

    async def before_route(self, request: RoutingRequest) -> None:
        return None

    def after_complete(self, request: RoutingRequest, outcome: RequestOutcome) -> None:
        if outcome.engine is not None and outcome.status < 400:
            self.served(outcome.engine.name)


AnswerSeen = Callable[[Engine, bytes], Awaitable[None]]


@dataclass
class Inbound:
    """A parsed request as the handler hands it over. `raw`: the body's bytes, if the parsed
    body is still exactly what they say (then they are forwarded byte for byte).

    `api`: the adapter of the request's API (usage, error shape, prompt). `engine`: the only
    engine that may serve it (a stored response's), never retried elsewhere. `generation`:
    False for a request that generates nothing (GET or cancel of a stored response,
    count_tokens): no hooks, no policy; it goes to `engine`, else to the least loaded.
    `on_answer`: told the engine and the answer's head (a stream's first chunk, a whole
    body) before the client has it, so an id in it is recorded before a follow-up can race.
    """

    request: RoutingRequest
    raw: bytes | None = None
    api: Api = CHAT
    engine: str | None = None
    generation: bool = True
    method: str = "POST"
    on_answer: AnswerSeen | None = None


Parse = Callable[[], Awaitable[Inbound]]


@dataclass
class Exchange:
    """One request's progress through the pipeline: what the one `finally` needs to finish it."""

    request_id: str
    path: str
    started: float
    span: RequestSpan | None
    request: RoutingRequest | None = None
    hooked: list[RequestHook] = field(default_factory=list)
    state: CycleState = field(default_factory=CycleState)
    decision: Decision | None = None
    decided: bool = False  # the policy made `decision` (and so hears how it went)
    result: RelayResult | None = None
    status: int = 500
    error: str | None = None
    overhead_s: float | None = None  # arrival to the first upstream send: the router's own time

    def fail(self, status: int, message: str) -> None:
        self.status, self.error = status, message


USAGE_OPTION = b'"stream_options":{"include_usage":true}'


def asks_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def upstream_payload(body: dict[str, Any], raw: bytes | None, *, add_usage: bool) -> bytes:
    """What the engine receives: `raw` as it came when it still says `body`, else `body` as JSON.

    `add_usage`: ask the engine for a streamed usage chunk (the router needs every request's
    usage: access log, hit rates, token counters); a client that did not ask for the chunk has it
    dropped from its stream (see relay_stream). Without other stream options, the option is
    spliced into the raw bytes (a streamed body is a non-empty object: it has `stream`)."""
    if not add_usage:
        return raw if raw is not None else orjson.dumps(body)
    if raw is not None and "stream_options" not in body:
        return raw.rstrip()[:-1] + b"," + USAGE_OPTION + b"}"
    options = body.get("stream_options")
    kept = options if isinstance(options, dict) else {}
    return orjson.dumps({**body, "stream_options": {**kept, "include_usage": True}})


class RequestPipeline:
    """Runs a parsed request through hooks, policy, engines and relay, and finishes it."""

    def __init__(
        self,
        *,
        pool: EnginePool,
        client: EngineClient,
        policy: Policy,
        metrics: RouterMetrics,
        admission: AdmissionController,
        hooks: Sequence[RequestHook] = (),
        retries: int = 1,
        forward_authorization: bool = True,
    ) -> None:
        self.pool = pool
        self.client = client
        self.policy = policy
        self.metrics = metrics
        self.admission = admission
        self.hooks: list[RequestHook] = list(hooks)
        self.retries = retries
        self.forward_authorization = forward_authorization

    async def serve(
        self, http: web.Request, request_id: str, span: RequestSpan | None, parse: Parse
    ) -> web.StreamResponse:
        """Admit, parse, route and relay one request; finish it however it ends."""
        ex = Exchange(request_id, http.path, time.perf_counter(), span)
        try:
            async with self.admission.admit():
                inbound = await parse()
                ex.request = inbound.request
                return await self._route(http, ex, inbound)
        except TooManyRequests as exc:
            self.metrics.rejected.labels("overloaded").inc()
            ex.fail(exc.status, exc.message)
            raise
        except HiverouteError as exc:
            ex.fail(exc.status, exc.message)
            raise
        except (ConnectionResetError, asyncio.CancelledError):
            ex.fail(499, "client disconnected")
            raise
        except Exception as exc:
            ex.fail(500, f"internal error: {type(exc).__name__}")
            raise
        finally:
            mark_finished(http)
            self._finish(ex)

    async def _route(self, http: web.Request, ex: Exchange, inbound: Inbound) -> web.StreamResponse:
        request = inbound.request
        original = request.body
        model = request.model
        if ex.span is not None:
            ex.span.set_request(ex.request_id, model, request.metadata)
        if model is not None and not self.pool.any_serves(model):
            served = sorted(self.pool.known_models())
            listed = ", ".join(repr(m) for m in served[:20]) + (" ..." if len(served) > 20 else "")
            raise NotFound(
                f"model {model!r} is not served by any engine; served: {listed or 'none yet'} "
                "(GET /v1/models lists them)",
                param="model",
                code="model_not_found",
            )
        if inbound.generation:
            for hook in self.hooks:
                ex.hooked.append(hook)
                await hook.before_route(request)
        api = inbound.api
        stream = bool(request.body.get("stream"))
        add_usage = stream and api.ask_stream_usage and not asks_usage(request.body)
        raw = inbound.raw if request.body is original else None  # a hook rewrote the body
        if inbound.method == "GET":
            payload = b""
        else:
            payload = upstream_payload(request.body, raw, add_usage=add_usage)
        headers = upstream_headers(
            http, ex.request_id, forward_authorization=self.forward_authorization
        )
        if ex.span is not None:
            ex.span.inject(headers)
        policy = self.policy
        if inbound.generation:
            await policy.prepare(request, ex.state)
        answer = await self._send(ex, inbound, payload, headers, stream=stream)
        engine = answer.engine
        extra = {
            "X-Request-Id": ex.request_id,
            "X-Hiveroute-Engine": engine.name,
            "X-Hiveroute-Policy": policy.name,
        }
        result = ex.result = RelayResult(status=499, error="client disconnected")
        response: web.StreamResponse | None = None
        # from here on the engine counts this request in flight and its answer is open: every
        # way out (a client gone while the adapter records the answer, too) uncounts and closes
        try:
            if answer.is_stream and inbound.on_answer is not None:
                await self._tell(inbound.on_answer, engine, answer.first_chunk)
            if answer.is_stream:
                told = None
                if ex.decided and api.first_token is not None:

                    def told() -> None:
                        policy.on_first_token(request, engine, ex.state)

                response, result = await relay_stream(
                    http,
                    answer,
                    extra,
                    ex.started,
                    drop_usage=add_usage,
                    api=api,
                    first_token=told,
                )
            else:
                response, result = await relay_whole(answer, extra, ex.started, api)
                if inbound.on_answer is not None and result.body:
                    await self._tell(inbound.on_answer, engine, result.body)
            ex.result = result
        except UpstreamError as exc:  # the engine failed before its whole answer was read
            self.pool.report_failure(engine, exc.message)
            answer.response.close()
            raise
        except (ConnectionResetError, OSError) as exc:  # the client went away mid-relay
            result.error = f"client disconnected: {type(exc).__name__}"
            answer.response.close()
        except BaseException:  # cancelled (the client went away) or failed before the relay
            answer.response.close()
            raise
        finally:
            engine.load.in_flight -= 1
        if response is None:
            raise ConnectionResetError("client disconnected")
        if result.error is not None and result.status < 400:
            self.pool.report_failure(engine, result.error)
        return response

    @staticmethod
    async def _tell(on_answer: AnswerSeen, engine: Engine, head: bytes) -> None:
        """An adapter's bookkeeping must not fail the answer it reads (a state store down)."""
        try:
            await on_answer(engine, head)
        except Exception:
            log.exception("recording what engine %s answered failed", engine.name)

    def _candidates(self, inbound: Inbound, tried: set[str]) -> list[Engine]:
        if inbound.engine is not None:  # pinned: that engine, whatever serves the model
            return [
                e
                for e in self.pool.engines
                if e.name == inbound.engine and e.healthy and e.name not in tried
            ]
        found = self.pool.candidates(inbound.request.model)
        return [e for e in found if e.name not in tried]

    async def _send(
        self,
        ex: Exchange,
        inbound: Inbound,
        payload: bytes,
        headers: dict[str, str],
        *,
        stream: bool,
    ) -> UpstreamAnswer:
        """Choose and send, once more elsewhere if the engine cannot be reached. The engine
        that answered stays counted in flight (the caller uncounts it after the relay)."""
        policy, metrics = self.policy, self.metrics
        request = inbound.request
        tried: set[str] = set()
        last_error = "no healthy engine"
        for attempt in range(self.retries + 1):
            ex.decision = None  # a filter that empties the candidates leaves no decision
            candidates = self._candidates(inbound, tried)
            if not candidates:
                break
            if inbound.generation:
                # the plugins' on_routed runs once the request is written, off its path; what
                # must be read at the decision (each engine's load, which then counts this
                # request in flight) the price kept (EngineLoad; read after the send, it
                # starved an engine: benchmarks/results/matrix_notes.md, session 35)
                decision = ex.decision = policy.decide_then_send(request, candidates, ex.state)
                ex.decided = True
            else:
                least = min(candidates, key=lambda e: e.load.in_flight)
                reason = "pinned" if inbound.engine is not None else "least_loaded"
                decision = ex.decision = Decision(engine=least, reason=reason)
                ex.decided = False
            engine = decision.engine
            tried.add(engine.name)
            if attempt == 0:
                ex.overhead_s = time.perf_counter() - ex.started
                metrics.overhead.labels(policy.name).observe(ex.overhead_s)
            metrics.decisions.labels(policy.name, decision.reason).inc()
            if ex.span is not None:
                ex.span.set_routed(engine.name, policy.name, decision.reason, attempt)
            engine.load.in_flight += 1
            try:
                answer = await self.client.send(
                    engine,
                    request.path,
                    payload,
                    headers,
                    stream=stream,
                    method=inbound.method,
                )
            except EngineUnreachable as exc:
                engine.load.in_flight -= 1
                last_error = str(exc)
                self.pool.report_failure(engine, last_error, slow=exc.slow)
                metrics.retries.labels(engine.name).inc()
                if ex.decided:
                    policy.on_completed(
                        request,
                        RequestOutcome(engine=engine, status=502, error=last_error),
                        ex.state,
                    )
                continue
            except BaseException:  # cancelled while waiting: nothing may stay counted
                engine.load.in_flight -= 1
                raise
            if answer.is_stream and ex.decided and inbound.api.first_token is None:
                policy.on_first_token(request, engine, ex.state)  # its first chunk: a token
            return answer
        ex.decision = None  # every engine tried has heard its own failure already
        self.metrics.rejected.labels("no_engine").inc()
        if inbound.engine is not None:
            raise NoEngineAvailable(
                f"engine {inbound.engine}, the only one that can serve this request, "
                f"could not ({last_error}); try again shortly"
            )
        raise NoEngineAvailable(
            f"no engine could serve this request ({last_error}); try again shortly"
        )

    def _finish(self, ex: Exchange) -> None:
        """The one end of every request: policy, hooks, metrics, span and log line."""
        duration = time.perf_counter() - ex.started
        result = ex.result
        if result is not None:
            ex.status, ex.error = result.status, result.error
        usage = result.usage if result is not None else None
        engine = ex.decision.engine if ex.decision is not None else None
        outcome = RequestOutcome(
            engine=engine,
            status=ex.status,
            ttft_s=result.ttft_s if result is not None else None,
            duration_s=duration,
            prompt_tokens=usage.prompt_tokens if usage else None,
            cached_tokens=usage.cached_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            error=ex.error,
        )
        request = ex.request
        if request is not None:
            if ex.decision is not None and ex.decided:
                self.policy.on_completed(request, outcome, ex.state)
            for hook in ex.hooked:
                try:
                    hook.after_complete(request, outcome)
                except Exception:  # the request is over: count and log it whatever a hook does
                    log.exception(
                        "request hook %s failed after %s", type(hook).__name__, ex.request_id
                    )
        self._count(ex, outcome, result, usage)
        stream = bool(request.body.get("stream")) if request is not None else False
        if ex.span is not None:
            if result is None:  # refused: a client's mistake is not marked as a failure
                ex.span.fail(ex.status, ex.error or "")
            else:
                ex.span.set_outcome(outcome, stream)
            ex.span.end()
        fields: dict[str, Any] = {"request_id": ex.request_id, "path": ex.path}
        if request is not None:
            fields["model"] = request.model
            fields.update(request.metadata.to_log())
        log_request(
            {
                **fields,
                "engine": engine.name if engine is not None else None,
                "policy": self.policy.name,
                "reason": ex.decision.reason if ex.decision is not None else None,
                "status": ex.status,
                "stream": stream,
                "ttft_ms": _ms(outcome.ttft_s),
                "itl_ms": _ms(result.itl_s if result is not None else None),
                "duration_ms": round(duration * 1000, 3),
                "overhead_ms": _ms(ex.overhead_s),
                "prompt_tokens": outcome.prompt_tokens,
                "cached_tokens": outcome.cached_tokens,
                "completion_tokens": outcome.completion_tokens,
                "error": ex.error,
                **self._prices(ex),
            }
        )

    @staticmethod
    def _prices(ex: Exchange) -> dict[str, Any]:
        """The candidates' prices in their parts, when a cost-based policy decided and
        request lines are written."""
        prices = ex.state.get(PRICES_KEY) if ex.decision is not None else None
        if not prices or not access_log_enabled():
            return {}
        return {"cost_ms": prices_for_log(prices)}

    def _count(
        self, ex: Exchange, outcome: RequestOutcome, result: RelayResult | None, usage: Usage | None
    ) -> None:
        metrics, policy = self.metrics, self.policy.name
        name = outcome.engine.name if outcome.engine is not None else NO_ENGINE
        metrics.requests.labels(
            name, policy, endpoint_label(ex.path), status_class(ex.status)
        ).inc()
        role = metrics.role_label(ex.request.metadata.agent_role if ex.request else None)
        metrics.agent_requests.labels(role).inc()
        if outcome.engine is None:
            return
        if outcome.ttft_s is not None and ex.status < 400:
            metrics.ttft.labels(name, policy).observe(outcome.ttft_s)
            metrics.agent_ttft.labels(role).observe(outcome.ttft_s)
        metrics.e2e.labels(name, policy).observe(outcome.duration_s)
        if result is not None and result.itl_s is not None:
            metrics.itl.labels(name, policy).observe(result.itl_s)
        if usage is not None and usage.prompt_tokens is not None:
            metrics.prompt_tokens.labels(name).inc(usage.prompt_tokens)
            metrics.agent_prompt_tokens.labels(role).inc(usage.prompt_tokens)
            if usage.cached_tokens:
                metrics.cached_tokens.labels(name).inc(usage.cached_tokens)
                metrics.agent_cached_tokens.labels(role).inc(usage.cached_tokens)
        if usage is not None and usage.completion_tokens:
            metrics.completion_tokens.labels(name).inc(usage.completion_tokens)


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 3) if seconds is not None else None
