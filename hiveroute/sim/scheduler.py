"""A scheduler like vLLM v1's: continuous batching under a per-step token budget.

Each step first serves the running requests in order (decodes and unfinished prefill chunks),
preempting (by recompute) when one cannot get a block: under FCFS the last running request,
under the priority policy the worst `(priority, arrival)`. If nothing was preempted, waiting
requests are admitted in policy order while the budget, `max_num_seqs` and the pool allow,
each starting from its prefix-cache hit. Chunked prefill splits a long prompt over steps.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hiveroute.sim.kv_cache import CacheRequest, KVCacheManager

WAITING, RUNNING, PREEMPTED, FINISHED = "waiting", "running", "preempted", "finished"


class SimRequest(CacheRequest):
    """A request inside the engine. `on_step` is called after each step that advanced it."""

    __slots__ = (
        "arrival",
        "eos_at",
        "finish_reason",
        "first_token_at",
        "ignore_eos",
        "last_token_at",
        "max_tokens",
        "min_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "on_step",
        "order",
        "priority",
        "prompt_cached_tokens",
        "request_id",
        "status",
        "stop_token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        max_tokens: int,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        eos_at: int | None = None,
        stop_token_ids: frozenset[int] = frozenset(),
        priority: int = 0,
        cache_salt: str | None = None,
        arrival: float = 0.0,
        on_step: Callable[[SimRequest, list[int]], None] | None = None,
    ) -> None:
        super().__init__(prompt_token_ids, cache_salt)
        self.request_id = request_id
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.ignore_eos = ignore_eos
        self.eos_at = eos_at  # output length at which the "model" emits EOS (None: never)
        self.stop_token_ids = stop_token_ids
        self.priority = priority
        self.arrival = arrival
        self.order = 0
        self.on_step = on_step
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.prompt_cached_tokens: int | None = None  # hit at first admission (usage detail)
        self.status = WAITING
        self.finish_reason: str | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


class WaitQueue:
    """FCFS deque or priority heap; preempted requests go back to the front (FCFS)."""

    def __init__(self, policy: str) -> None:
        self.priority = policy == "priority"
        self._fifo: deque[SimRequest] = deque()
        self._heap: list[tuple[int, float, int, SimRequest]] = []
        self._counter = itertools.count()
        self._removed: set[int] = set()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, request: SimRequest, *, front: bool = False) -> None:
        self._size += 1
        if self.priority:
            entry = (request.priority, request.arrival, next(self._counter), request)
            heapq.heappush(self._heap, entry)
        elif front:
            self._fifo.appendleft(request)
        else:
            self._fifo.append(request)

    def peek(self) -> SimRequest | None:
        if self.priority:
            while self._heap and id(self._heap[0][3]) in self._removed:
                self._removed.discard(id(heapq.heappop(self._heap)[3]))
            return self._heap[0][3] if self._heap else None
        return self._fifo[0] if self._fifo else None

    def pop(self) -> SimRequest:
        request = self.peek()
        assert request is not None
        self._size -= 1
        if self.priority:
            heapq.heappop(self._heap)
        else:
            self._fifo.popleft()
        return request

    def remove(self, request: SimRequest) -> None:
        self._size -= 1
        if self.priority:
            self._removed.add(id(request))
        else:
            self._fifo.remove(request)

    def __iter__(self) -> itertools.chain[SimRequest]:
        if self.priority:
            return itertools.chain(r for *_, r in self._heap if id(r) not in self._removed)
        return itertools.chain(self._fifo)


@dataclass
class StepPlan:
    """What one step computes: tokens per request, and the cost model's inputs."""

    scheduled: list[tuple[SimRequest, int]] = field(default_factory=list)
    prefill_tokens: int = 0
    attention_pairs: int = 0
    decode_seqs: int = 0
    decode_context: int = 0
    preempted: int = 0

    def __bool__(self) -> bool:
        return bool(self.scheduled)


@dataclass
class PrefixStats:
    queries: int = 0
    hits: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0


class Scheduler:
    """Decides who runs each step; the manager decides which blocks they get."""

    def __init__(
        self,
        manager: KVCacheManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        policy: str = "fcfs",
        enable_chunked_prefill: bool = True,
    ) -> None:
        self.manager = manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.policy = policy
        self.chunked_prefill = enable_chunked_prefill
        self.waiting = WaitQueue(policy)
        self.running: list[SimRequest] = []
        self.stats = PrefixStats()
        self.num_preemptions = 0
        self._order = itertools.count()

    def add(self, request: SimRequest) -> None:
        request.order = next(self._order)
        request.status = WAITING
        self.waiting.add(request)

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def _preempt(self, request: SimRequest) -> None:
        self.manager.free(request)
        request.status = PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add(request, front=True)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        manager = self.manager
        running = self.running
        bs = manager.block_size
        scheduled: dict[int, int] = {}  # id(request) -> tokens this step
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            new = len(request.token_ids) - request.num_computed_tokens
            new = min(new, budget, self.max_model_len - 1 - request.num_computed_tokens)
            if new <= 0:
                i += 1
                continue
            computed = request.num_computed_tokens
            if new == 1 and computed < len(request.blocks) * bs and (computed + 1) % bs:
                # A decode step inside an allocated, not yet full block: nothing to allocate
                # or cache (what allocate_slots would conclude, without its cost).
                scheduled[id(request)] = 1
                budget -= 1
                i += 1
                continue
            allocated = True
            while not manager.allocate_slots(request, request.num_computed_tokens, new):
                if self.policy == "priority":
                    victim = max(running, key=lambda r: (r.priority, r.arrival, r.order))
                else:
                    victim = running[-1]
                if running.index(victim) < i:
                    i -= 1
                running.remove(victim)
                budget += scheduled.pop(id(victim), 0)
                self._preempt(victim)
                plan.preempted += 1
                if victim is request:
                    allocated = False
                    break
            if not allocated:
                break
            scheduled[id(request)] = new
            budget -= new
            i += 1
        if not plan.preempted:
            waiting = self.waiting
            stats = self.stats
            while len(waiting) and budget > 0 and len(running) < self.max_num_seqs:
                head = waiting.peek()
                assert head is not None
                request = head
                hits, hit_tokens = manager.get_computed_blocks(request)
                new = len(request.token_ids) - hit_tokens
                if not self.chunked_prefill and new > budget:
                    break
                new = min(new, budget)
                if not manager.allocate_slots(request, 0, new, hits):
                    break
                if request.num_preemptions == 0:
                    request.prompt_cached_tokens = hit_tokens
                if not manager.enable_caching:
                    pass  # vLLM records no prefix-cache queries without prefix caching
                elif request.num_preemptions:
                    stats.preempted_queries += len(request.token_ids)
                    stats.preempted_hits += hit_tokens
                else:
                    stats.queries += len(request.token_ids)
                    stats.hits += hit_tokens
                waiting.pop()
                request.status = RUNNING
                request.num_computed_tokens = hit_tokens
                running.append(request)
                scheduled[id(request)] = new
                budget -= new
        if scheduled:
            for request in running:
                new = scheduled.get(id(request), 0)
                if not new:
                    continue
                computed = request.num_computed_tokens
                plan.scheduled.append((request, new))
                if new == 1 and computed >= request.num_prompt_tokens:
                    plan.decode_seqs += 1
                    plan.decode_context += computed
                else:
                    plan.prefill_tokens += new
                    plan.attention_pairs += new * computed + new * (new + 1) // 2
                request.num_computed_tokens = computed + new
        return plan

    def finish(self, request: SimRequest, reason: str) -> None:
        """Take a request out (finished or aborted) and free its blocks."""
        if request.status == RUNNING:
            self.running.remove(request)
        elif request.status in (WAITING, PREEMPTED):
            self.waiting.remove(request)
        elif request.status == FINISHED:
            return
        request.status = FINISHED
        request.finish_reason = reason
        self.manager.free(request)
