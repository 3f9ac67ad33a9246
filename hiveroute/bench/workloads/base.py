"""What every workload produces: units (a workflow, a chat session, one trace request) that
arrive at a scheduled offset and issue requests through a `UnitContext`.

A unit is a small async program, because the next request of an agent depends on the previous
one finishing (and, for chat, on its answer). The driver owns time and HTTP; a workload only
decides what to send and how long to wait between steps, which keeps each generator testable
with a fake context.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from hiveroute.bench.workloads.text import rng_for
from hiveroute.errors import ConfigError

Message = dict[str, Any]


@dataclass
class BenchRequest:
    """One request a unit wants sent: chat `messages` or a completion `prompt`; with `api`
    "responses" (`input_items`, `instructions`, `previous_response_id`) or "messages"
    (Anthropic `messages` and `system`), through that API instead (see bench/apis.py)."""

    max_tokens: int
    messages: list[Message] | None = None
    prompt: str | None = None
    api: str | None = None
    input_items: list[Message] | str | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    system: str | list[Message] | None = None
    # the identity headers the agent itself sends (Claude Code's, Codex's, ...), instead of
    # hiveroute's metadata headers; the fields above still label the request in the report
    identity_headers: dict[str, str] | None = None
    workflow_id: str | None = None
    agent_id: str | None = None
    agent_role: str | None = None
    session_id: str | None = None
    stage: str | None = None
    parents: list[str] = field(default_factory=list)  # request ids this one hands off from
    planned_gap_s: float = 0.0  # deliberate wait (tool call, think time) before it was sent
    context_refs: list[str] = field(default_factory=list)  # hiveroute's shared contexts

    def headers(self) -> dict[str, str]:
        """The DESIGN.md metadata headers (or the agent's own identity headers); peers' routers
        pass or ignore headers harmlessly."""
        if self.identity_headers is not None:
            return dict(self.identity_headers)
        pairs = {
            "X-Workflow-Id": self.workflow_id,
            "X-Agent-Id": self.agent_id,
            "X-Agent-Role": self.agent_role,
            "X-Session-Id": self.session_id,
            "X-Workflow-Stage": self.stage,
            "X-Parent-Request-Id": self.parents[-1] if self.parents else None,
        }
        return {k: v for k, v in pairs.items() if v}


@dataclass
class Reply:
    """What a unit learns from a request: its id (for hand-offs), the text, and success."""

    request_id: str
    text: str
    ok: bool
    error: str | None = None
    response_id: str | None = None  # the Responses API's id, for `previous_response_id`


class UnitFailed(Exception):
    """A request of the unit failed; the unit stops, as an agent framework would."""


class UnitContext(Protocol):
    async def send(self, request: BenchRequest) -> Reply: ...

    async def sleep(self, seconds: float) -> None: ...

    def now(self) -> float:
        """Seconds since the run started (for pacing a unit's steps)."""
        ...

    async def control(self, method: str, path: str, body: dict[str, Any] | None = None) -> None:
        """A call to the target's control API (hiveroute's /v1/workflows, /v1/contexts), not
        measured as a request; raises `UnitFailed` if it fails."""
        ...


@dataclass
class Unit:
    """One workflow / session / trace request: an arrival offset and the program to run."""

    unit_id: str
    kind: str
    arrival_s: float
    program: Callable[[UnitContext], Awaitable[None]]
    planned_requests: int = 0

    async def run(self, ctx: UnitContext) -> None:
        await self.program(ctx)


class Workload(Protocol):
    name: str

    def units(self) -> Iterator[Unit]:
        """The units in arrival order; finite, and the same for the same seed."""
        ...

    def describe(self) -> dict[str, Any]:
        """The parameters, for the report."""
        ...


async def must(ctx: UnitContext, request: BenchRequest) -> Reply:
    reply = await ctx.send(request)
    if not reply.ok:
        raise UnitFailed(reply.error or "request failed")
    return reply


# --- gaps and arrivals ---------------------------------------------------------------------

GAP_DISTRIBUTIONS = ("const", "exp", "uniform", "lognormal")


@dataclass(frozen=True)
class GapDistribution:
    """A distribution of waiting times in seconds, parsed from ``KIND:MEAN`` (e.g. ``exp:0.5``)."""

    kind: str = "exp"
    mean_s: float = 0.5

    @classmethod
    def parse(cls, text: str) -> GapDistribution:
        kind, sep, value = text.partition(":")
        if not sep:
            kind, value = "const", text
        if kind not in GAP_DISTRIBUTIONS:
            raise ConfigError(
                f"bad gap distribution {text!r}: kind must be one of {', '.join(GAP_DISTRIBUTIONS)}"
            )
        try:
            mean = float(value)
        except ValueError:
            raise ConfigError(f"bad gap distribution {text!r}: mean must be a number") from None
        if not math.isfinite(mean) or mean < 0:
            raise ConfigError(f"bad gap distribution {text!r}: mean must be >= 0")
        return cls(kind, mean)

    def sample(self, rng: Any) -> float:
        if self.mean_s == 0 or self.kind == "const":
            return self.mean_s
        if self.kind == "exp":
            return float(rng.expovariate(1.0 / self.mean_s))
        if self.kind == "uniform":
            return float(rng.uniform(0.0, 2.0 * self.mean_s))
        sigma = 0.8  # lognormal with this shape and the requested mean
        return float(rng.lognormvariate(math.log(self.mean_s) - sigma * sigma / 2, sigma))

    def __str__(self) -> str:
        return f"{self.kind}:{self.mean_s:g}"


def poisson_arrivals(rate: float, count: int, seed: int, *key: object) -> list[float]:
    """`count` arrival offsets of a Poisson process at `rate` per second (0 = all at once)."""
    if rate <= 0:
        return [0.0] * count
    rng = rng_for("arrivals", seed, *key)
    t = 0.0
    out = []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


# --- argument helpers ----------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number > 0")
    return value


def fraction(text: str) -> float:
    """A share in [0, 1)."""
    value = non_negative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a share from 0 to below 1, got {text}")
    return value


def gap_distribution(text: str) -> GapDistribution:
    try:
        return GapDistribution.parse(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
