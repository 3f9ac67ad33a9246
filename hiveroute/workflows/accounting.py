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

Origin = tuple[float, str]  # (request start time, agent id)


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
        # workflow -> engine -> block key -> origin
        self._maps: OrderedDict[str, dict[str, dict[BlockKey, Origin]]] = OrderedDict()
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
        blocks = maps.setdefault(engine, {})
        me = agent_id or ""
        hit_blocks = min(len(chain), (cached_tokens or 0) // self.block_size)
        # One lookup per block at C speed; then work per run of blocks one request stored, not
        # per block: a prompt's blocks come in a few runs (its shared context is one).
        origins = list(map(blocks.get, chain))
        mine: Origin = (started_at, me)
        cross = 0
        missing: list[BlockKey] = []
        start = 0
        for origin, run in groupby(origins):
            end = start + len(list(run))
            if origin is None:
                missing += chain[start:end]
            elif origin[0] > started_at:
                # this request started first (it finished later): it stored these blocks
                blocks.update(zip(chain[start:end], repeat(mine)))
            elif origin[1] != me and start < hit_blocks:
                cross += min(end, hit_blocks) - start
            start = end
        size = self._sizes.get(workflow_id, 0)
        stored = missing[: max(0, self.max_blocks - size)]
        if stored:
            blocks.update(zip(stored, repeat(mine)))
            self._sizes[workflow_id] = size + len(stored)
        return cross * self.block_size

    def forget(self, workflow_id: str) -> None:
        self._maps.pop(workflow_id, None)
        self._sizes.pop(workflow_id, None)
