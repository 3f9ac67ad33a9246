"""`agentloop`: coding-agent loops through the Responses and Messages APIs.

Each unit is one agent working a task, as Codex or an Agents SDK agent drives the Responses API
and Claude Code drives the Messages API: a long shared system prompt (instructions and tool
descriptions, the same for every agent), the agent's own task, then step after step a model
answer, a tool call that takes a while, and its result sent back. On the Responses API every step
names the previous response (`previous_response_id`), so the engine that stored it builds the
history; on the Messages API every step resends the whole history, the assistant's `tool_use`
and the user's `tool_result` blocks included. Either way the prompt grows by one turn a step and
its prefix is the previous step's prompt: what a cache-aware router keeps on one engine.
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
from hiveroute.bench.workloads.text import labelled_filler, rng_for

APIS = ("responses", "messages", "both")


@dataclass
class AgentLoopConfig:
    agents: int = 8
    rate: float = 1.0  # agent arrivals per second; 0 = all at once
    api: str = "both"  # both: even agents on Responses, odd ones on Messages
    steps: int = 4
    system_tokens: int = 1024
    task_tokens: int = 256
    result_tokens: int = 128
    answer_tokens: int = 48
    tool_time: GapDistribution = field(default_factory=lambda: GapDistribution("exp", 0.5))
    seed: int = 0
    namespace: str = ""

    def api_of(self, index: int) -> str:
        if self.api != "both":
            return self.api
        return "responses" if index % 2 == 0 else "messages"


class AgentLoopWorkload:
    name = "agentloop"

    def __init__(self, config: AgentLoopConfig) -> None:
        if config.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}")
        self.config = config

    def describe(self) -> dict[str, Any]:
        described = asdict(self.config)
        described["tool_time"] = str(self.config.tool_time)
        return {"workload": self.name, **described}

    def units(self) -> Iterator[Unit]:
        c = self.config
        for index, arrival in enumerate(poisson_arrivals(c.rate, c.agents, c.seed, "agentloop")):
            agent_id = f"agent-{c.seed}-{index}"
            api = c.api_of(index)
            program = (
                _ResponsesLoop(c, index, agent_id)
                if api == "responses"
                else _MessagesLoop(c, index, agent_id)
            )
            yield Unit(
                unit_id=agent_id,
                kind=f"agent-{api}",
                arrival_s=arrival,
                program=program.run,
                planned_requests=c.steps,
            )


class _Loop:
    """What both APIs share: the prompt texts, the metadata, and the tool-time waits."""

    def __init__(self, c: AgentLoopConfig, index: int, agent_id: str) -> None:
        self.c = c
        self.index = index
        self.agent_id = agent_id
        lead = (c.namespace + "\n") if c.namespace else ""
        self.system = lead + labelled_filler("tools", c.system_tokens, c.seed, "agentloop")
        self.task = labelled_filler("task", c.task_tokens, c.seed, index)
        self.rng = rng_for("tool-time", c.seed, index)

    def result(self, step: int) -> str:
        return labelled_filler("result", self.c.result_tokens, self.c.seed, self.index, step)

    def request(self, step: int, parents: list[str], gap: float, **fields: Any) -> BenchRequest:
        return BenchRequest(
            max_tokens=self.c.answer_tokens,
            session_id=self.agent_id,
            agent_id=self.agent_id,
            agent_role="coder",
            stage=f"step{step + 1}",
            parents=parents,
            planned_gap_s=gap,
            **fields,
        )

    async def tool(self, ctx: UnitContext, step: int) -> float:
        """The tool call between two steps (0 after the last one)."""
        if step + 1 >= self.c.steps:
            return 0.0
        gap = self.c.tool_time.sample(self.rng)
        await ctx.sleep(gap)
        return gap


class _ResponsesLoop(_Loop):
    async def run(self, ctx: UnitContext) -> None:
        items: list[Message] | str = self.task
        previous: str | None = None
        parents: list[str] = []
        gap = 0.0
        for step in range(self.c.steps):
            reply = await must(
                ctx,
                self.request(
                    step,
                    parents,
                    gap,
                    api="responses",
                    instructions=self.system,
                    input_items=items,
                    previous_response_id=previous,
                ),
            )
            previous, parents = reply.response_id, [reply.request_id]
            call_id = f"call_{self.index}_{step}"
            items = [
                {"type": "function_call_output", "call_id": call_id, "output": self.result(step)}
            ]
            gap = await self.tool(ctx, step)


class _MessagesLoop(_Loop):
    async def run(self, ctx: UnitContext) -> None:
        history: list[Message] = [{"role": "user", "content": self.task}]
        system = [{"type": "text", "text": self.system, "cache_control": {"type": "ephemeral"}}]
        parents: list[str] = []
        gap = 0.0
        for step in range(self.c.steps):
            reply = await must(
                ctx,
                self.request(
                    step, parents, gap, api="messages", system=system, messages=list(history)
                ),
            )
            parents = [reply.request_id]
            tool_use_id = f"toolu_{self.index}_{step}"
            history.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": reply.text},
                        {
                            "type": "tool_use",
                            "id": tool_use_id,
                            "name": "run",
                            "input": {"step": step},
                        },
                    ],
                }
            )
            history.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": tool_use_id,
                            "content": self.result(step),
                        }
                    ],
                }
            )
            gap = await self.tool(ctx, step)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = AgentLoopConfig()
    g = parser.add_argument_group("agentloop workload")
    g.add_argument("--agents", type=positive_int, default=d.agents, help="agent loops to run")
    g.add_argument(
        "--agent-rate",
        type=non_negative_float,
        default=d.rate,
        help="agent arrivals per second (Poisson; 0 = all at once)",
    )
    g.add_argument(
        "--agent-api",
        choices=APIS,
        default=d.api,
        help="the API the agents speak (both: half Responses, half Messages)",
    )
    g.add_argument("--steps", type=positive_int, default=d.steps, help="model calls per agent")
    g.add_argument(
        "--agent-system-tokens",
        type=non_negative_int,
        default=d.system_tokens,
        help="the shared instructions and tool descriptions",
    )
    g.add_argument("--agent-task-tokens", type=positive_int, default=d.task_tokens)
    g.add_argument("--agent-result-tokens", type=positive_int, default=d.result_tokens)
    g.add_argument("--agent-answer-tokens", type=positive_int, default=d.answer_tokens)
    g.add_argument(
        "--tool-time",
        type=gap_distribution,
        default=d.tool_time,
        metavar="KIND:MEAN_S",
        help="how long each tool call takes (default exp:0.5)",
    )


def from_args(args: argparse.Namespace, seed: int, namespace: str) -> AgentLoopWorkload:
    return AgentLoopWorkload(
        AgentLoopConfig(
            agents=args.agents,
            rate=args.agent_rate,
            api=args.agent_api,
            steps=args.steps,
            system_tokens=args.agent_system_tokens,
            task_tokens=args.agent_task_tokens,
            result_tokens=args.agent_result_tokens,
            answer_tokens=args.agent_answer_tokens,
            tool_time=args.tool_time,
            seed=seed,
            namespace=namespace,
        )
    )
