"""Pickers: turn ranked (engine, score) pairs into one choice."""

from __future__ import annotations

import itertools

from hiveroute.engines.engine import Engine
from hiveroute.routing.base import CycleState, Picker, RoutingRequest

TIE_EPSILON = 1e-9


class MaxScorePicker(Picker):
    """The best score wins; ties rotate, so equal engines share the work."""

    name = "max_score"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(
        self, request: RoutingRequest, ranked: list[tuple[Engine, float]], state: CycleState
    ) -> Engine:
        best = ranked[0][1]
        tied = [engine for engine, score in ranked if best - score <= TIE_EPSILON]
        if len(tied) == 1:
            return tied[0]
        tied.sort(key=lambda e: e.name)
        return tied[next(self._counter) % len(tied)]


class RoundRobinPicker(Picker):
    """Ignores scores: each request goes to the next engine in a fixed order."""

    name = "round_robin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(
        self, request: RoutingRequest, ranked: list[tuple[Engine, float]], state: CycleState
    ) -> Engine:
        engines = sorted((engine for engine, _ in ranked), key=lambda e: e.name)
        return engines[next(self._counter) % len(engines)]
