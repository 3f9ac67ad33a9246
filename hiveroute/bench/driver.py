"""The load driver: runs a workload's units against one OpenAI-compatible URL and measures.

Open loop: units start at their scheduled arrival whatever the target is doing (a slow target
gets a queue, not fewer arrivals). Closed loop: a fixed number of units in flight, the next one
starting when one ends. Every request is streamed with ``stream_options.include_usage`` so that
time to first token, the gaps between tokens and the engine's own token counts (prompt, cached,
completion) are all read off the same response. Bounded by a request budget and a deadline;
at the deadline nothing new starts, and what is still running is cancelled after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from hiveroute.bench.apis import WIRES, Wire
from hiveroute.bench.records import RequestRecord, UnitRecord
from hiveroute.bench.workloads.base import BenchRequest, Reply, Unit, UnitFailed

MODES = ("open", "closed")


@dataclass
class DriverOptions:
    mode: str = "open"
    concurrency: int = 8  # closed loop: units in flight
    max_requests: int = 0  # 0 = no budget beyond the workload's own size
    duration_s: float = 600.0  # nothing starts after this; then `grace_s` to finish
    grace_s: float = 30.0
    request_timeout_s: float = 300.0
    max_units_in_flight: int = 4096  # open loop: arrivals beyond this are recorded as dropped
    ignore_eos: bool = True
    temperature: float = 0.0


class Progress(Protocol):
    def update(self, done: int, errors: int, in_flight: int) -> None: ...


class Cutoff(Exception):
    """The run's deadline or request budget was reached: the unit stops, not as a failure."""


class CellRun:
    """One workload against one target: the records it produced."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        base_urls: Sequence[str],
        model: str,
        *,
        target: str,
        workload: str,
        options: DriverOptions,
        progress: Progress | None = None,
    ) -> None:
        self.http = http
        if not base_urls:
            raise ValueError("a cell needs at least one URL to send requests to")
        # requests go to each URL in turn: the replicas of one router target
        self.base_urls = [url.rstrip("/") for url in base_urls]
        self._next_url = 0
        self.model = model
        self.target = target
        self.workload = workload
        self.options = options
        self.progress = progress
        self.records: list[RequestRecord] = []
        self.units: list[UnitRecord] = []
        self.t0 = 0.0
        self.deadline = 0.0
        self.sent = 0
        self.in_flight = 0
        self.errors = 0
        # request id -> (first token time, end time), absolute perf_counter, for hand-offs
        self._ends: dict[str, float] = {}

    # --- the clock ----------------------------------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress.update(len(self.records), self.errors, self.in_flight)

    # --- running units ------------------------------------------------------------------

    async def run(self, units: Iterable[Unit]) -> None:
        self.t0 = time.perf_counter()
        self.deadline = self.options.duration_s
        tasks: set[asyncio.Task[None]] = set()
        try:
            if self.options.mode == "closed":
                await self._closed_loop(iter(units), tasks)
            else:
                await self._open_loop(units, tasks)
            await self._drain(tasks)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            self._tick()

    async def _open_loop(self, units: Iterable[Unit], tasks: set[asyncio.Task[None]]) -> None:
        for unit in units:
            wait = unit.arrival_s - self.now()
            if unit.arrival_s >= self.deadline or self._budget_spent():
                break
            if wait > 0:
                await asyncio.sleep(wait)
            if len(tasks) >= self.options.max_units_in_flight:
                record = UnitRecord(
                    unit.unit_id, unit.kind, self.target, self.workload, unit.arrival_s, self.now()
                )
                record.error = "dropped: too many units in flight in the driver"
                self.units.append(record)
                continue
            task = asyncio.create_task(self._run_unit(unit))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _closed_loop(self, units: Any, tasks: set[asyncio.Task[None]]) -> None:
        lock = asyncio.Lock()

        async def worker() -> None:
            while self.now() < self.deadline and not self._budget_spent():
                async with lock:
                    unit = next(units, None)
                if unit is None:
                    return
                await self._run_unit(unit)

        for _ in range(self.options.concurrency):
            task = asyncio.create_task(worker())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _drain(self, tasks: set[asyncio.Task[None]]) -> None:
        if not tasks:
            return
        limit = self.deadline + self.options.grace_s - self.now()
        if limit > 0:
            await asyncio.wait(set(tasks), timeout=limit)

    def _budget_spent(self) -> bool:
        return bool(self.options.max_requests) and self.sent >= self.options.max_requests

    async def _run_unit(self, unit: Unit) -> None:
        record = UnitRecord(
            unit.unit_id, unit.kind, self.target, self.workload, unit.arrival_s, self.now()
        )
        self.units.append(record)
        try:
            await unit.run(_UnitContext(self, record))
        except Cutoff:
            record.cut = True
        except UnitFailed as exc:
            record.error = str(exc)
        except asyncio.CancelledError:
            record.cut = True
            raise
        finally:
            record.end_s = self.now()

    async def control(self, method: str, path: str, body: dict[str, Any] | None) -> None:
        """A control-API call through the first URL (replicas would each need the state)."""
        timeout = aiohttp.ClientTimeout(total=self.options.request_timeout_s)
        url = self.base_urls[0] + path
        try:
            async with self.http.request(method, url, json=body, timeout=timeout) as response:
                if response.status >= 400:
                    text = await _error_text(response)
                    raise UnitFailed(f"{method} {path}: HTTP {response.status}: {text}")
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UnitFailed(f"{method} {path}: {type(exc).__name__}: {exc}") from None

    # --- one request ---------------------------------------------------------------------

    async def send(self, request: BenchRequest, unit: UnitRecord) -> Reply:
        if self.now() >= self.deadline or self._budget_spent():
            raise Cutoff()
        self.sent += 1
        unit.requests += 1
        request_id = f"{unit.unit_id}.{unit.requests}"
        chat = request.messages is not None
        wire = WIRES[request.api] if request.api is not None else None
        endpoint = wire.endpoint if wire is not None else "chat" if chat else "completion"
        record = RequestRecord(
            request_id=request_id,
            unit_id=unit.unit_id,
            target=self.target,
            workload=self.workload,
            endpoint=endpoint,
            t_send_s=self.now(),
            max_tokens=request.max_tokens,
            agent_role=request.agent_role,
            stage=request.stage,
            workflow_id=request.workflow_id,
            session_id=request.session_id,
            parents=list(request.parents),
            planned_gap_s=request.planned_gap_s,
        )
        self.in_flight += 1
        self._tick()
        text = ""
        response_id: list[str] = []
        try:
            if wire is not None:
                text = await self._stream_typed(wire, request, record, response_id)
            else:
                text = await self._stream(request, record)
        except asyncio.CancelledError:
            record.error, record.cut = "cancelled at the end of the run", True
            raise
        finally:
            self.in_flight -= 1
            if record.error is not None and not record.cut:
                self.errors += 1
            self.records.append(record)
            self._tick()
        return Reply(
            request_id, text, record.ok, record.error, response_id[0] if response_id else None
        )

    def _body(self, request: BenchRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": self.options.temperature,
        }
        if self.options.ignore_eos:
            body["ignore_eos"] = True
        if request.context_refs:
            body["hiveroute"] = {"context_refs": list(request.context_refs)}
        if request.messages is not None:
            body["messages"] = request.messages
        else:
            body["prompt"] = request.prompt
        return body

    async def _stream(self, request: BenchRequest, record: RequestRecord) -> str:
        chat = request.messages is not None
        base = self.base_urls[self._next_url % len(self.base_urls)]
        self._next_url += 1
        record.sent_to = base
        url = base + ("/v1/chat/completions" if chat else "/v1/completions")
        headers = {"X-Request-Id": record.request_id, **request.headers()}
        start = time.perf_counter()
        pieces: list[str] = []
        first = last = None
        timeout = aiohttp.ClientTimeout(total=self.options.request_timeout_s)
        try:
            async with self.http.post(
                url, json=self._body(request), headers=headers, timeout=timeout
            ) as response:
                record.status = response.status
                record.engine = response.headers.get("X-Hiveroute-Engine")
                if response.status >= 400:
                    record.error = f"HTTP {response.status}: {await _error_text(response)}"
                    return ""
                done = False
                async for raw in response.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        record.error = "unparsable stream chunk"
                        return ""
                    if isinstance(chunk, dict) and chunk.get("error"):
                        record.error = f"error in stream: {_message(chunk['error'])}"
                        return ""
                    piece = _chunk_text(chunk, chat)
                    if piece:
                        now = time.perf_counter()
                        if first is None:
                            first = now
                        else:
                            record.itl_s.append(now - (last or now))
                        last = now
                        pieces.append(piece)
                    _read_usage(chunk, record)
                if not done:
                    record.error = "stream ended before [DONE]"
        except TimeoutError:
            record.error = f"timed out after {self.options.request_timeout_s:g}s"
        except aiohttp.ClientError as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        self._timed(record, start, first, last)
        return "".join(pieces)

    def _timed(
        self, record: RequestRecord, start: float, first: float | None, last: float | None
    ) -> None:
        """TTFT, TPOT, end-to-end and hand-off time of a finished stream."""
        end = time.perf_counter()
        record.e2e_s = end - start
        if first is not None:
            record.ttft_s = first - start
            if record.parents:
                parent_ends = [self._ends[p] for p in record.parents if p in self._ends]
                if parent_ends:
                    record.handoff_s = first - max(parent_ends)
            if last is not None and record.completion_tokens and record.completion_tokens > 1:
                record.tpot_s = (last - first) / (record.completion_tokens - 1)
        if record.error is None and first is None:
            record.error = "no tokens in the response"
        self._ends[record.request_id] = last if last is not None else end

    async def _stream_typed(
        self, wire: Wire, request: BenchRequest, record: RequestRecord, response_id: list[str]
    ) -> str:
        """A stream of typed SSE events (`event:` then `data:`), read by the API's wire."""
        base = self.base_urls[self._next_url % len(self.base_urls)]
        self._next_url += 1
        record.sent_to = base
        headers = {"X-Request-Id": record.request_id, **request.headers()}
        body = wire.body(request, self.model, self.options.temperature)
        if self.options.ignore_eos:
            body["ignore_eos"] = True
        start = time.perf_counter()
        pieces: list[str] = []
        first = last = None
        kind = ""
        timeout = aiohttp.ClientTimeout(total=self.options.request_timeout_s)
        try:
            async with self.http.post(
                base + wire.path, json=body, headers=headers, timeout=timeout
            ) as response:
                record.status = response.status
                record.engine = response.headers.get("X-Hiveroute-Engine")
                if response.status >= 400:
                    record.error = f"HTTP {response.status}: {await _error_text(response)}"
                    return ""
                done = False
                async for raw in response.content:
                    line = raw.strip()
                    if line.startswith(b"event:"):
                        kind = line[6:].strip().decode(errors="replace")
                        continue
                    if not line.startswith(b"data:"):
                        continue
                    try:
                        data = json.loads(line[5:].strip())
                    except ValueError:
                        record.error = "unparsable stream event"
                        return ""
                    if not isinstance(data, dict):
                        continue
                    read = wire.read(kind or str(data.get("type", "")), data, record)
                    if read.error is not None:
                        record.error = f"error in stream: {read.error}"
                        return ""
                    if read.text:
                        now = time.perf_counter()
                        if first is None:
                            first = now
                        else:
                            record.itl_s.append(now - (last or now))
                        last = now
                        pieces.append(read.text)
                    if read.response_id:
                        response_id.append(read.response_id)
                    if read.done:
                        done = True
                        break
                if not done:
                    record.error = "stream ended before its last event"
        except TimeoutError:
            record.error = f"timed out after {self.options.request_timeout_s:g}s"
        except aiohttp.ClientError as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        self._timed(record, start, first, last)
        return "".join(pieces)


class _UnitContext:
    def __init__(self, run: CellRun, unit: UnitRecord) -> None:
        self.run = run
        self.unit = unit

    async def send(self, request: BenchRequest) -> Reply:
        return await self.run.send(request, self.unit)

    def now(self) -> float:
        return self.run.now()

    async def control(self, method: str, path: str, body: dict[str, Any] | None = None) -> None:
        await self.run.control(method, path, body)

    async def sleep(self, seconds: float) -> None:
        remaining = self.run.deadline - self.run.now()
        if seconds >= remaining:
            await asyncio.sleep(max(0.0, remaining))
            raise Cutoff()
        await asyncio.sleep(seconds)


def _chunk_text(chunk: Any, chat: bool) -> str:
    if not isinstance(chunk, dict):
        return ""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    if chat:
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return ""
        text = delta.get("content") or delta.get("reasoning_content") or ""
    else:
        text = choice.get("text") or ""
    return text if isinstance(text, str) else ""


def _read_usage(chunk: Any, record: RequestRecord) -> None:
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    if not isinstance(usage, dict):
        return
    if isinstance(usage.get("prompt_tokens"), int):
        record.prompt_tokens = usage["prompt_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        record.completion_tokens = usage["completion_tokens"]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        record.cached_tokens = details["cached_tokens"]


def _message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


async def _error_text(response: aiohttp.ClientResponse) -> str:
    with contextlib.suppress(Exception):
        body = await response.read()
        with contextlib.suppress(ValueError):
            payload = json.loads(body)
            if isinstance(payload, dict) and "error" in payload:
                return _message(payload["error"])[:300]
        return body[:300].decode(errors="replace")
    return "(no body)"
