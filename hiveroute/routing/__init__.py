"""Routing: a policy is a pipeline of filters, weighted scorers and a picker (after llm-d)."""

from hiveroute.routing.base import (
    CycleState,
    Decision,
    Filter,
    Picker,
    Plugin,
    RequestOutcome,
    RoutingRequest,
    Scorer,
    ScorerCategory,
)
from hiveroute.routing.policy import Policy, WeightedScorer

__all__ = [
    "CycleState",
    "Decision",
    "Filter",
    "Picker",
    "Plugin",
    "Policy",
    "RequestOutcome",
    "RoutingRequest",
    "Scorer",
    "ScorerCategory",
    "WeightedScorer",
]
