"""Anthropic `cache_control` blocks as keep-warm hints (the simplest honest version).

A Messages request that marks blocks with `cache_control` says the client will send that
prefix again within the block's TTL ("5m" by default, or "1h"). After such a request is served,
the prefix up to its last `cache_control` block is kept warm on the engine that served it, for
that TTL, by the keep-warm loop (workflows/keepwarm.py): when it has been idle for
`keep_warm_idle_s`, a one-token request refreshes its blocks, within `keep_warm_max_rps`. The
router does not charge or price anything differently: vLLM's prefix cache is automatic; this
only makes eviction of the marked prefix less likely while the client said it would return.
"""

from __future__ import annotations

import hashlib
import json

from hiveroute.protocols.anthropic import cache_control_prefix
from hiveroute.routing.base import RequestOutcome, RoutingRequest
from hiveroute.workflows.keepwarm import KeepWarm

MESSAGES_PATH = "/v1/messages"


class CacheControlHints:
    """A request hook: after a Messages request with `cache_control`, hint its prefix."""

    def __init__(self, keep_warm: KeepWarm) -> None:
        self.keep_warm = keep_warm

    async def before_route(self, request: RoutingRequest) -> None:
        return None

    def after_complete(self, request: RoutingRequest, outcome: RequestOutcome) -> None:
        if request.path != MESSAGES_PATH or outcome.engine is None or outcome.status >= 400:
            return
        if not self.keep_warm.enabled:
            return
        found = cache_control_prefix(request.body)
        if found is None:
            return
        body, ttl_s = found
        salt = request.body.get("cache_salt")
        if isinstance(salt, str):  # a tenant's: its blocks are the salted ones
            body = {**body, "cache_salt": salt}
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]
        self.keep_warm.hint(outcome.engine.name, MESSAGES_PATH, body, ttl_s, key)
