"""Which contexts lately built on each prefix cached in the fleet.

The longest prefix of a request that some engine holds is, for most requests, either the
request's own history (one conversation or one workflow builds on it) or a prefix that many
independent contexts share: a system prompt every chat session starts with, a knowledge base
every workflow reads. How many distinct contexts built on it in the recent past is how many
will in the near future, and that is what a copy of it to another engine would serve. A
context is a workflow, else a session, else the request alone: a fan-out's siblings are one
context (their workflow's placement keeps them together), a hundred chat sessions are a
hundred. One record per router, fed by the cost model when a request is routed.

Bookkeeping only: what a count means for a decision is `routing/cost.py`'s business.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from hiveroute.kvindex.blocks import BlockKey
from hiveroute.routing.base import RoutingRequest
from hiveroute.routing.live_set import DEFAULT_LIVE_WINDOW_S

# Prefixes remembered by their last block, least recently built on dropped first.
MAX_PREFIXES = 65_536
# Distinct contexts remembered per prefix: enough to tell "more than the fleet has engines".
MAX_CONTEXTS = 1024


def context_of(request: RoutingRequest) -> Hashable:
    """The context a request belongs to: its workflow, else its session, else itself."""
    meta = request.metadata
    return (request.tenant, meta.workflow_id or meta.session_id or request.request_id)


class SharedPrefixes:
    """Per prefix (named by its last block's key), the distinct contexts that built on it
    within the live window."""

    def __init__(
        self,
        window_s: float = DEFAULT_LIVE_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        max_prefixes: int = MAX_PREFIXES,
        max_contexts: int = MAX_CONTEXTS,
    ) -> None:
        if window_s <= 0:
            raise ValueError("sharing window must be positive")
        if max_prefixes <= 0 or max_contexts <= 0:
            raise ValueError("max_prefixes and max_contexts must be positive")
        self.window_s = window_s
        self.clock = clock
        self.max_prefixes = max_prefixes
        self.max_contexts = max_contexts
        # last block -> context -> when it last built on the prefix (oldest first)
        self._builders: OrderedDict[BlockKey, OrderedDict[Hashable, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._builders)

    def built_on(self, last_block: BlockKey, context: Hashable) -> None:
        """`context` was routed a request whose longest prefix cached in the fleet ends here."""
        prefixes = self._builders
        builders = prefixes.get(last_block)
        if builders is None:
            builders = prefixes[last_block] = OrderedDict()
            while len(prefixes) > self.max_prefixes:
                prefixes.popitem(last=False)
        else:
            prefixes.move_to_end(last_block)
        builders[context] = self.clock()
        builders.move_to_end(context)
        while len(builders) > self.max_contexts:
            builders.popitem(last=False)

    def contexts(self, last_block: BlockKey, *, besides: Hashable = None) -> int:
        """How many distinct contexts built on the prefix ending here lately, `besides` one
        (the asking request's own context is not evidence that others share the prefix)."""
        builders = self._builders.get(last_block)
        if not builders:
            return 0
        horizon = self.clock() - self.window_s
        while builders and next(iter(builders.values())) < horizon:
            builders.popitem(last=False)
        return len(builders) - (besides in builders)
