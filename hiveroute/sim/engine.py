"""One simulated engine: the step loop that drives scheduler, cache, clock and events.

Each step the scheduler picks what runs, the cost model says how long that takes, the loop
sleeps until the step's modelled end (chained from the previous step's, so wall time does not
drift), then hands every request its new token and publishes the step's KV events. The HTTP
layer (`server.py`) only submits requests and reads their tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hiveroute.kvindex.tokenizer import BUILTIN_SPECIAL, Tokenizer
from hiveroute.lifecycle import cancel_and_wait
from hiveroute.sim.clock import PreciseTimer
from hiveroute.sim.config import SimConfig
from hiveroute.sim.deadlines import DeadlineBoard, SizedWorkCost, WorkCost
from hiveroute.sim.events import EventPublisher
from hiveroute.sim.faults import FaultKnobs
from hiveroute.sim.kv_cache import Block, BlockPool, CacheRequest, KVCacheManager
from hiveroute.sim.metrics import EngineMetrics
from hiveroute.sim.presets import CostModel
from hiveroute.sim.scheduler import RUNNING, Scheduler, SimRequest, StepPlan

log = logging.getLogger("hiveroute.sim.engine")

# What the simulated model "writes": a fixed text, tokenized once with the engine's tokenizer.
OUTPUT_TEXT = (
    " The quick brown fox jumps over the lazy dog. A simulated engine writes this text again"
    " and again, one token each step, so that streams carry real tokens and real text. Tools"
    " are called, plans are made, results are checked, and the next agent takes over."
)
MAX_PINS = 4096
MAX_STREAM_INTERVAL = 0.1  # longest a streamed token waits for its socket write, seconds
MAX_CATCH_UP = 0.01  # an engine further behind its timeline than this starts afresh, seconds
PRODUCE_SLICE = 16  # requests given their token between two yields to the event loop
WRITE_SLICE = 8  # streams written between two yields to the event loop
LAG_SAMPLES = 200_000


class PendingWrites(Protocol):
    """A stream with chunks waiting for the end of the step (the server's writer)."""

    @property
    def urgent(self) -> bool:
        """Holds a chunk that must never wait: a stream's first token or its last."""
        ...

    def flush(self) -> None: ...


@dataclass(slots=True)
class Output:
    """What one step gave a request: new token ids and text, and whether it finished."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass
class SamplingParams:
    """The request fields that change what the engine generates, checked by the server."""

    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    eos_at: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    include_stop_str_in_output: bool = False
    priority: int = 0
    cache_salt: str | None = None


@dataclass
class RequestHandle:
    """A submitted request as the server sees it: its outputs and counts.

    Outputs go to `sink` when one is set (called synchronously from the step loop: the HTTP
    layer writes the stream chunk right there, with no task switch per token), else to `queue`.
    `done` resolves when the request finishes or is aborted.
    """

    request: SimRequest
    params: SamplingParams
    queue: asyncio.Queue[Output] = field(default_factory=asyncio.Queue)
    sink: Callable[[Output], None] | None = None
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    text: str = ""
    emitted_text_len: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    plain: bool = False  # no stop strings or ids: the step loop's fast path applies

    def __post_init__(self) -> None:
        p = self.params
        self.plain = not p.stop and not p.stop_token_ids

    @property
    def prompt_tokens(self) -> int:
        return self.request.num_prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return self.request.num_output_tokens

    @property
    def cached_tokens(self) -> int:
        return self.request.prompt_cached_tokens or 0


class SimEngine:
    """A vLLM engine core in miniature, with its KV-event publisher and metrics."""

    def __init__(
        self,
        config: SimConfig,
        index: int,
        tokenizer: Tokenizer,
        board: DeadlineBoard | None = None,
    ) -> None:
        self.config = config
        self.index = index
        self.tokenizer = tokenizer
        preset = config.resolved_preset()
        self.cost: CostModel = preset.cost
        self.model_name = config.model_name()
        self.block_size = config.block_size
        self.max_model_len = config.model_len()
        self.pool = BlockPool(config.blocks(), config.block_size, enable_events=config.kv_events)
        self.manager = KVCacheManager(self.pool, enable_caching=config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.manager,
            max_num_seqs=config.seqs(),
            max_num_batched_tokens=config.batched_tokens(),
            max_model_len=self.max_model_len,
            policy=config.scheduling_policy,
            enable_chunked_prefill=config.enable_chunked_prefill,
        )
        self.faults = FaultKnobs(**{**config.faults.to_json(), "seed": config.seed + index})
        self.metrics = EngineMetrics(
            self.model_name, index, num_gpu_blocks=self.pool.num_blocks, block_size=self.block_size
        )
        self.publisher: EventPublisher | None = None
        self.eos_token_id = _eos_token_id(tokenizer)
        self._out_ids, self._out_texts = _output_stream(tokenizer, self.eos_token_id)
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._timer = PreciseTimer()
        # Shared by the engines of one process: their step ends, which other work keeps clear of.
        self.board = board if board is not None else DeadlineBoard()
        self.slice_cost = WorkCost(0.0001)  # giving PRODUCE_SLICE requests their tokens
        # taking in a request (parse, tokenize, submit), per byte of its body
        self.intake_cost = SizedWorkCost(1e-7)
        # Requests are taken in one at a time in arrival order, as vLLM's scheduler sees them.
        self.intake_lock = asyncio.Lock()
        self.write_cost = WorkCost(0.0001)  # writing WRITE_SLICE streams' pending chunks
        self._task: asyncio.Task[None] | None = None
        self._handles: dict[int, RequestHandle] = {}
        self._pins: OrderedDict[tuple[int, ...], tuple[list[Block], asyncio.TimerHandle]] = (
            OrderedDict()
        )
        self._reported = (0, 0, 0)  # prefix queries, prefix hits, preemptions already counted
        self.steps = 0
        self.timeline_resets = 0
        # While a step "runs" its outputs are prepared but held: streams with chunks waiting
        # go to the outbox, finished requests to `_due`; both are released at the step's end.
        # A stream may wait longer (`stream_interval`) while the engine falls behind.
        self.in_step = False
        self.outbox: set[PendingWrites] = set()
        self.chunks_written = 0  # stream chunks written, and the socket writes that took them:
        self.socket_writes = 0  # more chunks than writes means tokens held past their step
        self._due: list[RequestHandle] = []
        self.stream_interval = 0.0
        self._late_share = 0.0  # smoothed (handed-out lag / step time)
        self._last_flush = 0.0
        # Per step: (woke - due, outputs handed out - due, modelled duration), seconds.
        self.step_lags: deque[tuple[float, float, float]] = deque(maxlen=LAG_SAMPLES)
        self.url = ""
        self.events_endpoint: str | None = None
        self.replay_endpoint: str | None = None

    # --- life cycle --------------------------------------------------------------------------

    async def start_events(self, port: int, replay_port: int | None) -> None:
        if not self.config.kv_events:
            return
        publisher = EventPublisher(
            self.config.host,
            port,
            replay_port,
            topic=self.config.event_topic,
            legacy=self.config.legacy_event_encoding,
            buffer_steps=self.config.replay_buffer_steps,
        )
        publisher.start()
        self.publisher = publisher
        self.events_endpoint = publisher.endpoint
        self.replay_endpoint = publisher.replay_endpoint

    def start_loop(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"sim-engine-{self.index}"
        )

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        for handle in list(self._handles.values()):
            self.abort(handle)
        for _, timer in self._pins.values():
            timer.cancel()
        self._pins.clear()
        if self.publisher is not None:
            await self.publisher.stop()
            self.publisher = None
        self._timer.close()

    async def restart_events(self) -> None:
        """Fault: restart the KV-event publisher; its sequence numbers start again at 0."""
        if self.publisher is None:
            raise RuntimeError("this engine publishes no KV events")
        await self.publisher.restart()
        self.events_endpoint = self.publisher.endpoint
        self.replay_endpoint = self.publisher.replay_endpoint

    # --- requests ----------------------------------------------------------------------------

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> RequestHandle:
        request = SimRequest(
            f"req-{self.index}-{next(self._ids)}",
            prompt_token_ids,
            max_tokens=params.max_tokens,
            min_tokens=params.min_tokens,
            ignore_eos=params.ignore_eos,
            eos_at=params.eos_at,
            stop_token_ids=params.stop_token_ids,
            priority=params.priority,
            cache_salt=params.cache_salt,
            arrival=time.monotonic(),
            on_step=self._on_step,
        )
        if self.manager.enable_caching:
            # As vLLM does when a request arrives: its prompt's block hashes are worked out
            # now, as it is taken in, not by the step that admits it.
            request.hashes_upto(request.num_prompt_tokens // self.block_size, self.block_size)
        handle = RequestHandle(request=request, params=params)
        self._handles[id(request)] = handle
        self.scheduler.add(request)
        self._wake.set()
        return handle

    def abort(self, handle: RequestHandle) -> None:
        """Client went away: take the request out and free its blocks now."""
        request = handle.request
        if request.finish_reason is not None:
            return
        self.scheduler.finish(request, "abort")
        self._handles.pop(id(request), None)
        handle.finish_reason = "abort"
        if not handle.done.done():
            handle.done.set_result(None)
        self.metrics.success["abort"].inc()
        self._wake.set()

    def _finish(self, handle: RequestHandle, reason: str, stop_reason: str | int | None) -> None:
        request = handle.request
        self.scheduler.finish(request, reason)
        self._handles.pop(id(request), None)
        handle.finish_reason = reason
        handle.stop_reason = stop_reason
        metrics = self.metrics
        metrics.success[reason].inc()
        metrics.e2e.observe(time.monotonic() - request.arrival)

    def _on_step(self, request: SimRequest, new_ids: list[int]) -> None:
        handle = self._handles.get(id(request))
        if handle is None:
            return
        params = handle.params
        n_out = request.num_output_tokens
        token = new_ids[-1]
        if (
            handle.plain
            and token != self.eos_token_id
            and n_out < request.max_tokens
            and len(request.token_ids) < self.max_model_len
        ):
            # The common case (no stop conditions, not the last token): straight to the client.
            out = Output(new_ids, self._out_texts[(n_out - 1) % len(self._out_texts)])
            if handle.sink is not None:
                handle.sink(out)
            else:
                handle.queue.put_nowait(out)
            return
        text = (
            ""
            if token == self.eos_token_id
            else self._out_texts[(n_out - 1) % len(self._out_texts)]
        )
        reason: str | None = None
        stop_reason: str | int | None = None
        if n_out >= params.min_tokens:
            if token == self.eos_token_id and not params.ignore_eos:
                reason = "stop"
            elif token in params.stop_token_ids:
                reason, stop_reason = "stop", token
                if not params.include_stop_str_in_output:
                    text = ""
        emit_text = text
        if params.stop and reason is None and n_out >= params.min_tokens:
            before = len(handle.text)
            combined = handle.text + text
            window = max(0, before - max(len(s) for s in params.stop) + 1)
            for stop in params.stop:
                at = combined.find(stop, window)
                if at >= 0:
                    end = at + len(stop) if params.include_stop_str_in_output else at
                    emit_text = combined[before:end] if end > before else ""
                    handle.text = combined[: max(end, 0)]
                    reason, stop_reason = "stop", stop
                    break
            else:
                handle.text = combined
        elif params.stop:
            handle.text += text  # kept only to find stop strings that span tokens
        if reason is None and n_out >= request.max_tokens:
            reason = "length"
        if reason is None and len(request.token_ids) >= self.max_model_len:
            reason = "length"
        if reason is not None:
            self._finish(handle, reason, stop_reason)
        out = Output(new_ids, emit_text, reason, stop_reason)
        if handle.sink is not None:
            handle.sink(out)
        else:
            handle.queue.put_nowait(out)
        if reason is not None and not handle.done.done():
            if self.in_step:
                self._due.append(handle)  # the response ends with the step, not before
            else:
                handle.done.set_result(None)

    # --- the step loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        scheduler = self.scheduler
        cost = self.cost
        scale = self.config.time_scale
        lags = self.step_lags
        timer = self._timer
        clock = time.monotonic
        # The modelled instant the engine became free: while it stays busy each step starts
        # where the last one was due to end, so a late step does not push every later one back.
        timeline: float | None = None
        while True:
            if not scheduler.has_work():
                timeline = None
                self._flush_outbox()
                self._wake.clear()
                await self._wake.wait()
                continue
            now = clock()
            if timeline is not None and now - timeline > MAX_CATCH_UP:
                self.timeline_resets += 1  # too far behind to catch up: the backlog is lost
                timeline = None
            started = now if timeline is None else timeline
            plan = scheduler.schedule()
            self._publish()
            if not plan:
                # Everyone waits for blocks that only a pin's expiry or an abort can free.
                timeline = None
                self._flush_outbox()
                self._wake.clear()
                await self._wake.wait()
                continue
            duration = scale * cost.step_time(
                plan.prefill_tokens, plan.attention_pairs, plan.decode_seqs, plan.decode_context
            )
            target = started + duration
            # Everything the step produces is worked out while the step "runs"; at its end only
            # the socket writes remain, so a step's outputs leave on time.
            self.in_step = True
            try:
                await self._produce(plan, target)
                self.board.sleeping_until(self.index, target)
                await timer.sleep_until(target)
            except BaseException:
                self.board.served(self.index)
                raise
            finally:
                self.in_step = False
            woke = clock()
            self.steps += 1
            # The step is over: its KV events, first and last tokens go out now; the other
            # engines' work may go on (the board), and the rest of the stream chunks are
            # written in the gaps between their step ends, as vLLM's API server writes them
            # in its own process while the engine core runs the next step.
            self._flush_urgent()
            self._release_finished()
            self._publish()
            self.board.served(self.index)
            await self._write_outbox(woke, latest=woke + duration / 2)
            handed_out = clock()
            lags.append((woke - target, handed_out - target, duration))
            timeline = target
            self._adapt_stream_interval(min(1.0, (handed_out - target) / duration), duration)

    async def _produce(self, plan: StepPlan, stamp: float) -> None:
        """Give each request the step's token, stamped with the step's modelled end.

        Runs in slices, each only when it does not run over another engine's step end (see
        `DeadlineBoard`), so that a step due elsewhere is not held up by this bookkeeping.
        """
        out_ids = self._out_ids
        n_ids = len(out_ids)
        eos = self.eos_token_id
        metrics = self.metrics
        board = self.board
        cost = self.slice_cost
        clock = time.perf_counter
        scheduled = plan.scheduled
        slices_left = -(-len(scheduled) // PRODUCE_SLICE)
        started = 0.0
        generated = 0
        for i, (request, _) in enumerate(scheduled):
            if not i % PRODUCE_SLICE:
                if i:
                    cost.observe(clock() - started)
                await board.gap(
                    cost.seconds, owner=self.index, latest=stamp - slices_left * cost.seconds
                )
                slices_left -= 1
                started = clock()
            tokens = request.token_ids
            if request.status != RUNNING or request.num_computed_tokens < len(tokens):
                continue  # aborted during the step, or a prefill chunk with more to come
            n_out = len(tokens) - request.num_prompt_tokens
            eos_at = request.eos_at
            if eos_at is not None and n_out + 1 >= eos_at and not request.ignore_eos:
                token = eos
            else:
                token = out_ids[n_out % n_ids]
            tokens.append(token)
            generated += 1
            if request.first_token_at is None:
                request.first_token_at = stamp
                metrics.ttft.observe(stamp - request.arrival)
            else:
                metrics.itl.observe(stamp - (request.last_token_at or stamp))
            request.last_token_at = stamp
            if request.on_step is not None:
                request.on_step(request, [token])
        metrics.generation_tokens.inc(generated)
        metrics.prompt_tokens.inc(plan.prefill_tokens)

    def _adapt_stream_interval(self, late_share: float, duration: float) -> None:
        """Hold stream chunks for a few steps only while the engine stays behind its model.

        One socket write per token is most of a crowded engine's work; when the handed-out
        lag stays above 5 % of the step (a smoothed figure, so one slow step does not count),
        several tokens share a write, and as soon as the engine is on time again they do not.
        """
        self._late_share = ewma = 0.9 * self._late_share + 0.1 * late_share
        if ewma > 0.05:
            self.stream_interval = min(
                max(1.5 * self.stream_interval, duration), MAX_STREAM_INTERVAL
            )
        elif ewma < 0.02 and self.stream_interval:
            half = self.stream_interval / 2
            self.stream_interval = half if half >= 0.001 else 0.0

    def _release_finished(self) -> None:
        """The requests that finished in the step end with it: their responses may complete."""
        due, self._due = self._due, []
        for handle in due:
            if not handle.done.done():
                handle.done.set_result(None)

    def _flush_urgent(self) -> None:
        """Write the streams holding a first token or a last one: those never wait."""
        outbox = self.outbox
        urgent = [writer for writer in outbox if writer.urgent]
        for writer in urgent:
            outbox.discard(writer)
            writer.flush()

    def _flush_outbox(self) -> None:
        """Write every stream's pending chunks now (the engine goes idle)."""
        outbox, self.outbox = self.outbox, set()
        for writer in outbox:
            writer.flush()

    async def _write_outbox(self, now: float, latest: float) -> None:
        """Write the streams' pending chunks once the stream interval is up, a slice at a time
        in the gaps between other engines' step ends, and all of them by `latest`."""
        if not self.outbox or now - self._last_flush < self.stream_interval:
            return
        self._last_flush = now
        writers, self.outbox = list(self.outbox), set()
        board = self.board
        cost = self.write_cost
        clock = time.perf_counter
        for i in range(0, len(writers), WRITE_SLICE):
            await board.gap(cost.seconds, owner=self.index, latest=latest)
            started = clock()
            for writer in writers[i : i + WRITE_SLICE]:
                writer.flush()
            cost.observe(clock() - started)

    def _publish(self) -> None:
        if self.pool.events:
            events = self.pool.take_events()
            if self.publisher is not None:
                self.publisher.publish(events)

    # --- cache controls ----------------------------------------------------------------------

    def retain(
        self, token_ids: Sequence[int], cache_salt: str | None, seconds: float
    ) -> dict[str, Any]:
        """Pin the cached prefix of `token_ids` for `seconds` (keep-warm's retention hint).

        Pinned blocks hold a reference, so neither eviction nor preemption can take them; a
        second hint for the same prefix renews the timer; seconds=0 releases the pin.
        """
        probe = CacheRequest(token_ids, cache_salt)
        bs = self.block_size
        hashes = probe.hashes_upto(len(token_ids) // bs, bs)
        blocks: list[Block] = []
        for block_hash in hashes:
            block = self.pool.get_cached(block_hash)
            if block is None:
                break
            blocks.append(block)
        key = tuple(hashes[: len(blocks)]) if blocks else ()
        previous = self._pins.pop(key, None) if key else None
        if previous is not None:
            previous[1].cancel()
            self.pool.free_blocks(list(reversed(previous[0])))
        if not blocks or seconds <= 0:
            self._wake.set()
            return {"pinned_blocks": 0, "pinned_tokens": 0, "expires_in_s": 0.0}
        while len(self._pins) >= MAX_PINS:
            _, (old_blocks, old_timer) = self._pins.popitem(last=False)
            old_timer.cancel()
            self.pool.free_blocks(list(reversed(old_blocks)))
        self.pool.touch(blocks)
        timer = asyncio.get_running_loop().call_later(seconds, self._unpin, key)
        self._pins[key] = (blocks, timer)
        return {
            "pinned_blocks": len(blocks),
            "pinned_tokens": len(blocks) * bs,
            "expires_in_s": seconds,
        }

    def _unpin(self, key: tuple[int, ...]) -> None:
        entry = self._pins.pop(key, None)
        if entry is not None:
            self.pool.free_blocks(list(reversed(entry[0])))
            self._wake.set()

    def reset_prefix_cache(self) -> bool:
        """vLLM's POST /reset_prefix_cache: only when no block is in use."""
        done = self.pool.reset()
        self._publish()
        return done

    # --- observation -------------------------------------------------------------------------

    def render_metrics(self) -> bytes:
        m = self.metrics
        s = self.scheduler
        m.running.set(len(s.running))
        m.waiting.set(len(s.waiting))
        m.kv_usage.set(self.pool.usage())
        queries, hits, preemptions = s.stats.queries, s.stats.hits, s.num_preemptions
        q0, h0, p0 = self._reported
        m.prefix_queries.inc(queries - q0)
        m.prefix_hits.inc(hits - h0)
        m.preemptions.inc(preemptions - p0)
        self._reported = (queries, hits, preemptions)
        return m.render()

    def state(self) -> dict[str, Any]:
        """A JSON snapshot for tests and the admin API."""
        s = self.scheduler
        return {
            "running": len(s.running),
            "waiting": len(s.waiting),
            "num_blocks": self.pool.num_blocks,
            "free_blocks": self.pool.num_free,
            "cached_blocks": self.pool.num_cached_blocks(),
            "kv_cache_usage": self.pool.usage(),
            "prefix_cache_queries": s.stats.queries,
            "prefix_cache_hits": s.stats.hits,
            "preemptions": s.num_preemptions,
            "evictions": self.pool.evictions,
            "pins": len(self._pins),
            "steps": self.steps,
            "timeline_resets": self.timeline_resets,
            "block_size": self.block_size,
            "event_restarts": self.publisher.restarts if self.publisher else 0,
        }


def _eos_token_id(tokenizer: Tokenizer) -> int:
    token = getattr(tokenizer, "eos_token", None)
    rust = getattr(tokenizer, "_tok", None)
    if token and rust is not None:
        found = rust.token_to_id(token)
        if found is not None:
            return int(found)
    return BUILTIN_SPECIAL["</s>"]


def _output_stream(tokenizer: Tokenizer, eos: int) -> tuple[list[int], list[str]]:
    """The output tokens and, for each, the text it adds (decoded by prefix differences)."""
    ids = [t for t in tokenizer.encode(OUTPUT_TEXT, add_special_tokens=False) if t != eos]
    if not ids:
        ids = [BUILTIN_SPECIAL["<s>"] + 100]
    texts: list[str] = []
    previous = ""
    for i in range(1, len(ids) + 1):
        decoded = tokenizer.decode(ids[:i])
        texts.append(decoded[len(previous) :] if decoded.startswith(previous) else "")
        previous = decoded
    return ids, texts
