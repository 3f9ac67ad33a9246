"""`multiturn`: chat sessions with one shared system prompt and a growing history.

The shape of vLLM production-stack's multi-round QA benchmark: every user starts with the same
system prompt and a history of their own, then asks questions turn after turn (with think time
between), each request carrying the whole conversation so far.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from hiveroute.bench.workloads.base import (
    BenchRequest,
    GapDistribution,
    Message,
    Unit,
    UnitContext,
    gap_distribution,
    must,
    non_negative_float,
    non_negative_int,
    poisson_arrivals,
    positive_int,
)
from hiveroute.bench.workloads.text import filler, labelled_filler, rng_for


@dataclass
class MultiturnConfig:
    users: int = 16
    rate: float = 1.0  # session arrivals per second; 0 = all at once
    turns: int = 4
    system_tokens: int = 1024
    history_tokens: int = 1024  # each user's own history before the first question
    question_tokens: int = 64
    answer_tokens: int = 96
    think_time: GapDistribution = field(default_factory=lambda: GapDistribution("exp", 1.0))
    seed: int = 0
    namespace: str = ""


class MultiturnWorkload:
    name = "multiturn"

    def __init__(self, config: MultiturnConfig) -> None:
        self.config = config

    def describe(self) -> dict[str, Any]:
        described = asdict(self.config)
        described["think_time"] = str(self.config.think_time)
        return {"workload": self.name, **described}

    def units(self) -> Iterator[Unit]:
        c = self.config
        for index, arrival in enumerate(poisson_arrivals(c.rate, c.users, c.seed, "multiturn")):
            session_id = f"chat-{c.seed}-{index}"
            yield Unit(
                unit_id=session_id,
                kind="session",
                arrival_s=arrival,
                program=_session(c, index, session_id),
                planned_requests=c.turns,
            )


def _session(c: MultiturnConfig, index: int, session_id: str) -> Any:
    lead = (c.namespace + "\n") if c.namespace else ""
    system = lead + labelled_filler("system", c.system_tokens, c.seed, "system")

    async def run(ctx: UnitContext) -> None:
        history: list[Message] = [{"role": "system", "content": system}]
        if c.history_tokens:
            history.append(
                {
                    "role": "user",
                    "content": labelled_filler(
                        f"user{c.seed}x{index}", c.history_tokens, c.seed, index
                    ),
                }
            )
            history.append({"role": "assistant", "content": filler(32, c.seed, index, "ack")})
        rng = rng_for("think", c.seed, index)
        parents: list[str] = []
        gap = 0.0
        for turn in range(c.turns):
            history.append(
                {
                    "role": "user",
                    "content": labelled_filler("question", c.question_tokens, c.seed, index, turn),
                }
            )
            reply = await must(
                ctx,
                BenchRequest(
                    max_tokens=c.answer_tokens,
                    messages=list(history),
                    session_id=session_id,
                    agent_id=session_id,
                    agent_role="chat",
                    stage=f"turn{turn + 1}",
                    parents=parents,
                    planned_gap_s=gap,
                ),
            )
            history.append({"role": "assistant", "content": reply.text})
            parents = [reply.request_id]
            if turn + 1 < c.turns:
                gap = c.think_time.sample(rng)
                await ctx.sleep(gap)

    return run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = MultiturnConfig()
    g = parser.add_argument_group("multiturn workload")
    g.add_argument("--users", type=positive_int, default=d.users, help="chat sessions to run")
    g.add_argument(
        "--session-rate",
        type=non_negative_float,
        default=d.rate,
        help="session arrivals per second (Poisson; 0 = all at once)",
    )
    g.add_argument("--turns", type=positive_int, default=d.turns, help="questions per session")
    g.add_argument(
        "--system-tokens",
        type=non_negative_int,
        default=d.system_tokens,
        help="system prompt shared by every session",
    )
    g.add_argument(
        "--history-tokens",
        type=non_negative_int,
        default=d.history_tokens,
        help="each user's own history before the first question",
    )
    g.add_argument(
        "--question-tokens",
        type=positive_int,
        default=d.question_tokens,
        help="size of each question",
    )
    g.add_argument(
        "--answer-tokens",
        type=positive_int,
        default=d.answer_tokens,
        help="output tokens per answer",
    )
    g.add_argument(
        "--think-time",
        type=gap_distribution,
        default=d.think_time,
        metavar="KIND:MEAN_S",
        help="time between a reply and the next question (default exp:1)",
    )


def from_args(args: argparse.Namespace, seed: int, namespace: str) -> MultiturnWorkload:
    return MultiturnWorkload(
        MultiturnConfig(
            users=args.users,
            rate=args.session_rate,
            turns=args.turns,
            system_tokens=args.system_tokens,
            history_tokens=args.history_tokens,
            question_tokens=args.question_tokens,
            answer_tokens=args.answer_tokens,
            think_time=args.think_time,
            seed=seed,
            namespace=namespace,
        )
    )
