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

from collections import Counter, OrderedDict
from itertools import compress, repeat
from operator import is_

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
        # One lookup per block at C speed; then work per distinct origin, not per block: a
        # prompt's blocks were stored by a few earlier requests (its shared context by one).
        origins = list(map(blocks.get, chain))
        cross = 0
        for origin, count in Counter(origins[:hit_blocks]).items():
            if origin is not None and origin[1] != me and origin[0] <= started_at:
                cross += count
        mine: Origin = (started_at, me)
        later = {o for o in set(origins) if o is not None and o[0] > started_at}
        if later:  # this request started first (it finished later): it stored those blocks
            for key, origin in zip(chain, origins, strict=True):
                if origin in later:
                    blocks[key] = mine
        missing = list(compress(chain, map(is_, origins, repeat(None))))
        size = self._sizes.get(workflow_id, 0)
        stored = missing[: max(0, self.max_blocks - size)]
        if stored:
            blocks.update(zip(stored, repeat(mine)))
            self._sizes[workflow_id] = size + len(stored)
        return cross * self.block_size

    def forget(self, workflow_id: str) -> None:
        self._maps.pop(workflow_id, None)
        self._sizes.pop(workflow_id, None)
