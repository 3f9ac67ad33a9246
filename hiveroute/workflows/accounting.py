"""Cross-agent accounting: prompt tokens served from blocks another agent of the workflow stored.

The engine says how many prompt tokens hit its cache (`usage.cached_tokens`, a prefix); this
module says who put those blocks there. Per workflow and engine it remembers, for each chained
block of `block_size` tokens, the earliest-started request that sent it there and its agent.
A request's hit tokens whose blocks another agent of the same workflow sent first (and started
before it) are cross-agent. This holds whatever the routing policy, with or without KV events;
memory is bounded per workflow, and a workflow's map is dropped when it ends or expires.
Blocks are keyed as the KV index keys them (`kvindex.blocks.block_keys`); this is the router's
one cross-agent attribution (the index knows where blocks are, not who stored them).
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import groupby, repeat

from hiveroute.kvindex.blocks import BlockKey
from hiveroute.kvindex.tokenizer import Tokenizer
from hiveroute.routing.base import RoutingRequest
from hiveroute.routing.request_tokens import prompt_block_keys
from hiveroute.workflows.parents import common_blocks

Origin = tuple[float, str]  # (request start time, agent id)
Run = tuple[Origin | None, int]  # consecutive blocks of a chain with one origin (None: not kept)


class _EngineBlocks:
    """One workflow's blocks on one engine: each block's origin, and the last chain accounted
    here as runs of blocks with one origin, as the map held them after that request.

    Nothing but `account` on this very map changes it, so for the blocks a new chain shares
    with the last one (agents of a workflow repeat its context) the runs say what the map holds
    without a lookup per block: a 4,000-word context cost 470 lookups a request, most of them
    cache misses in a map of 100,000 blocks."""

    __slots__ = ("chain", "origins", "runs")

    def __init__(self) -> None:
        self.origins: dict[BlockKey, Origin] = {}
        self.chain: list[BlockKey] = []
        self.runs: list[Run] = []

    def runs_of(self, chain: list[BlockKey]) -> list[Run]:
        """`chain` as runs of blocks with one origin: the last chain's runs as far as it
        shares them, looked up block by block after that."""
        known = common_blocks(self.chain, chain)
        runs: list[Run] = []
        left = known
        for origin, length in self.runs:
            if left <= 0:
                break
            runs.append((origin, min(length, left)))
            left -= length
        if known < len(chain):
            found = map(self.origins.get, chain[known:])
            runs += [(origin, len(list(run))) for origin, run in groupby(found)]
        return runs


class CrossAgentAccountant:
    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        block_size: int = 16,
        max_blocks_per_workflow: int = 200_000,
        max_workflows: int = 10_000,
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.max_blocks = max_blocks_per_workflow
        self.max_workflows = max_workflows
        # workflow -> engine -> its blocks there
        self._maps: OrderedDict[str, dict[str, _EngineBlocks]] = OrderedDict()
        self._sizes: dict[str, int] = {}

    def block_keys(self, request: RoutingRequest) -> list[BlockKey] | None:
        """The request's block keys: those routing computed when it did (one tokenization and
        one keying per request), the KV index's scheme."""
        return prompt_block_keys(request, self.tokenizer, self.block_size)

    def account(
        self,
        workflow_id: str,
        agent_id: str | None,
        engine: str,
        chain: list[BlockKey],
        cached_tokens: int | None,
        started_at: float,
    ) -> int:
        """Record this request's blocks (`chain`: its block keys); return its cross-agent
        cached tokens."""
        maps = self._maps.get(workflow_id)
        if maps is None:
            maps = self._maps[workflow_id] = {}
            while len(self._maps) > self.max_workflows:
                old, _ = self._maps.popitem(last=False)
                self._sizes.pop(old, None)
        self._maps.move_to_end(workflow_id)
        held = maps.get(engine)
        if held is None:
            held = maps[engine] = _EngineBlocks()
        origins = held.origins
        me = agent_id or ""
        hit_blocks = min(len(chain), (cached_tokens or 0) // self.block_size)
        mine: Origin = (started_at, me)
        size = self._sizes.get(workflow_id, 0)
        room = max(0, self.max_blocks - size)  # blocks this workflow may still add
        cross = 0
        after: list[Run] = []  # the chain's runs as the map holds them when this ends
        start = 0
        for origin, length in held.runs_of(chain):
            end = start + length
            if origin is None:  # nobody stored these: this request did, as far as room lasts
                kept = min(length, room)
                if kept:
                    origins.update(zip(chain[start : start + kept], repeat(mine)))
                    room -= kept
                    after.append((mine, kept))
                if kept < length:
                    after.append((None, length - kept))
            elif origin[0] > started_at:
                # this request started first (it finished later): it stored these blocks
                origins.update(zip(chain[start:end], repeat(mine)))
                after.append((mine, length))
            else:
                if origin[1] != me and start < hit_blocks:
                    cross += min(end, hit_blocks) - start
                after.append((origin, length))
            start = end
        added = max(0, self.max_blocks - size) - room
        if added:
            self._sizes[workflow_id] = size + added
        held.chain, held.runs = chain, after
        return cross * self.block_size

    def forget(self, workflow_id: str) -> None:
        self._maps.pop(workflow_id, None)
        self._sizes.pop(workflow_id, None)
