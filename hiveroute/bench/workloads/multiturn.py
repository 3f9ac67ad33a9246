"""`multiturn`: chat sessions with one shared system prompt and a growing history.

The shape of vLLM production-stack's multi-round QA benchmark: every user starts with the same
system prompt and a history of their own, then asks questions turn after turn (with think time
between), each request carrying the whole conversation so far.

Two ways to size and pace it. By parts: `system_tokens` shared by all, `history_tokens` each,
think time between a reply and the next question, sessions arriving at `rate`. Or as that
benchmark does: `conversation_tokens` (a session's prompt at its last turn) of which
`system_share` is the system prompt every session shares, and `active_users` sessions at once
sending `request_rate` requests per second in all: each session asks every
``active_users / request_rate`` seconds (start to start, later if its answer is late), and a
finished session is followed by a new one in its slot.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from hiveroute.bench.workloads.base import (
    BenchRequest,
    GapDistribution,
    Message,
    Unit,
    UnitContext,
    fraction,
    gap_distribution,
    must,
    non_negative_float,
    non_negative_int,
    poisson_arrivals,
    positive_int,
)
from hiveroute.bench.workloads.text import filler, labelled_filler, rng_for
from hiveroute.errors import ConfigError


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
    # sizing by the whole conversation (None: by the parts above)
    conversation_tokens: int | None = None  # the prompt at the last turn, about
    system_share: float | None = None  # of conversation_tokens, the shared system prompt
    # pacing by a request rate (0: sessions arrive at `rate` and think between turns)
    active_users: int = 0
    request_rate: float = 0.0

    ACK_TOKENS = 32  # the assistant's short reply to a user's history

    def validate(self) -> MultiturnConfig:
        """Resolve the whole-conversation sizing into system and history tokens."""
        if self.system_share is not None and not 0 <= self.system_share < 1:
            raise ConfigError(f"system share must be in [0, 1), got {self.system_share:g}")
        if (self.active_users > 0) != (self.request_rate > 0):
            raise ConfigError("--active-users and --request-rate go together")
        if self.conversation_tokens is None:
            if self.system_share is not None:
                raise ConfigError("--system-share needs --conversation-tokens")
            return self
        system = self.system_tokens
        if self.system_share is not None:
            system = round(self.system_share * self.conversation_tokens)
        turns = self.turns * (self.question_tokens + self.answer_tokens)
        history = self.conversation_tokens - system - turns - self.ACK_TOKENS
        if history < 0:
            raise ConfigError(
                f"a {self.conversation_tokens}-token conversation cannot hold a {system}-token "
                f"system prompt and {self.turns} turns of {self.question_tokens}+"
                f"{self.answer_tokens} tokens"
            )
        return replace(self, system_tokens=system, history_tokens=history)

    def turn_interval_s(self) -> float:
        """Start to start between a session's turns when paced by a request rate (else 0)."""
        return self.active_users / self.request_rate if self.request_rate > 0 else 0.0

    def arrivals(self) -> list[float]:
        """Session arrival offsets: Poisson at `rate`, or slot by slot when paced."""
        if self.active_users <= 0:
            return poisson_arrivals(self.rate, self.users, self.seed, "multiturn")
        lifetime = self.turns * self.turn_interval_s()
        return [
            (i % self.active_users) / self.request_rate + (i // self.active_users) * lifetime
            for i in range(self.users)
        ]


class MultiturnWorkload:
    name = "multiturn"

    def __init__(self, config: MultiturnConfig) -> None:
        self.config = config.validate()

    def describe(self) -> dict[str, Any]:
        described = asdict(self.config)
        described["think_time"] = str(self.config.think_time)
        return {"workload": self.name, **described}

    def units(self) -> Iterator[Unit]:
        c = self.config
        for index, arrival in enumerate(c.arrivals()):
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
        # no system message at all when nothing is shared (not even a chat template's header)
        history: list[Message] = [{"role": "system", "content": system}] if system else []
        if c.history_tokens:
            history.append(
                {
                    "role": "user",
                    "content": labelled_filler(
                        f"user{c.seed}x{index}", c.history_tokens, c.seed, index
                    ),
                }
            )
            ack = filler(c.ACK_TOKENS, c.seed, index, "ack")
            history.append({"role": "assistant", "content": ack})
        rng = rng_for("think", c.seed, index)
        parents: list[str] = []
        gap = 0.0
        interval = c.turn_interval_s()
        for turn in range(c.turns):
            started = ctx.now()
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
                if interval > 0:
                    gap = max(0.0, started + interval - ctx.now())
                else:
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
    g.add_argument(
        "--conversation-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="size each session by its whole conversation: about N prompt tokens at its last "
        "turn (system prompt + own history + turns); sets --history-tokens",
    )
    g.add_argument(
        "--system-share",
        type=fraction,
        default=None,
        metavar="F",
        help="with --conversation-tokens: the share (0 to <1) of each conversation that is the "
        "system prompt every session shares; sets --system-tokens",
    )
    g.add_argument(
        "--active-users",
        type=non_negative_int,
        default=d.active_users,
        metavar="N",
        help="with --request-rate: N sessions at once, each asking every N/RATE s (or when its "
        "answer arrives, if later), a finished one followed by the next in its slot (vLLM "
        "production-stack's multi-round QA pacing); replaces --session-rate and --think-time",
    )
    g.add_argument(
        "--request-rate",
        type=non_negative_float,
        default=d.request_rate,
        metavar="RATE",
        help="with --active-users: requests per second from all sessions together",
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
            conversation_tokens=args.conversation_tokens,
            system_share=args.system_share,
            active_users=args.active_users,
            request_rate=args.request_rate,
        )
    )
