"""Program-level scheduling: least attained service first (Autellix's PLAS).

A workflow's attained service is the engine work it has had so far: uncached prompt tokens plus
generated tokens over all its finished requests. Each request gets vLLM's `priority` (lower is
served first, with ``--scheduling-policy priority``) from that service, on a log scale: a
workflow's level rises by one each time its service doubles past `quantum_tokens`, so a short
workflow is not starved behind a long one, while a long one still moves.
"""

from __future__ import annotations

import math


def plas_priority(service_tokens: float, *, quantum_tokens: int = 2048, max_level: int = 32) -> int:
    """The priority level for a workflow that has received `service_tokens` of service."""
    if service_tokens <= 0:
        return 0
    return min(max_level, int(math.log2(1.0 + service_tokens / quantum_tokens)))
