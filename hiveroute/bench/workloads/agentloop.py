"""`agentloop`: coding-agent loops through the Responses and Messages APIs.

Each unit is one agent working a task, as Codex or an Agents SDK agent drives the Responses API
and Claude Code drives the Messages API: a long shared system prompt (instructions and tool
descriptions, the same for every agent), the agent's own task, then step after step a model
answer, a tool call that takes a while, and its result sent back. On the Responses API every step
names the previous response (`previous_response_id`), so the engine that stored it builds the
history; on the Messages API every step resends the whole history, the assistant's `tool_use`
and the user's `tool_result` blocks included. Either way the prompt grows by one turn a step and
its prefix is the previous step's prompt: what a cache-aware router keeps on one engine.

With `--subagents N` each agent spawns N subagents after its first step, in parallel, each
starting from the parent's context (a Responses subagent forks the parent's latest response, a
Messages subagent resends the parent's conversation with its subtask) and running its own loop;
their answers go back to the parent as tool results. Requests carry the identity the agents
themselves send (Codex's `session-id` / `thread-id` / `x-codex-parent-thread-id`, Claude Code's
`x-claude-code-session-id` / `x-claude-code-agent-id`), or hiveroute's headers with
`--agent-identity hiveroute`.
"""

from __future__ import annotations

import argparse
import asyncio
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
IDENTITIES = ("native", "hiveroute")


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
    subagents: int = 0  # spawned in parallel by each agent after its `fan_out_step`-th step
    subagent_steps: int = 2
    fan_out_step: int = 0
    identity: str = "native"  # the agents' own headers (Codex's, Claude Code's) or hiveroute's
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
        if config.identity not in IDENTITIES:
            raise ValueError(f"identity must be one of {', '.join(IDENTITIES)}")
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
                planned_requests=c.steps + c.subagents * c.subagent_steps,
            )


class _Loop:
    """What both APIs share: the prompt texts, the identity, and the tool-time waits."""

    def __init__(self, c: AgentLoopConfig, index: int, agent_id: str) -> None:
        self.c = c
        self.index = index
        self.agent_id = agent_id  # also the session: subagents share it
        lead = (c.namespace + "\n") if c.namespace else ""
        self.system = lead + labelled_filler("tools", c.system_tokens, c.seed, "agentloop")
        self.task = labelled_filler("task", c.task_tokens, c.seed, index)
        self.rng = rng_for("tool-time", c.seed, index)

    def result(self, name: str, step: int) -> str:
        return labelled_filler("result", self.c.result_tokens, self.c.seed, name, step)

    def subtask(self, i: int) -> str:
        return labelled_filler("subtask", self.c.task_tokens, self.c.seed, self.index, i)

    def identity(self, name: str, parent: str | None) -> dict[str, str]:
        raise NotImplementedError

    def request(
        self,
        name: str,
        parent: str | None,
        step: int,
        parents: list[str],
        gap: float,
        **fields: Any,
    ) -> BenchRequest:
        native = self.c.identity == "native"
        return BenchRequest(
            max_tokens=self.c.answer_tokens,
            session_id=self.agent_id,
            agent_id=name,
            agent_role="coder" if parent is None else "subagent",
            stage=f"step{step + 1}",
            parents=parents,
            planned_gap_s=gap,
            identity_headers=self.identity(name, parent) if native else None,
            **fields,
        )

    async def tool(self, ctx: UnitContext, step: int, steps: int) -> float:
        """The tool call between two steps (none after the last one)."""
        if step + 1 >= steps:
            return 0.0
        gap = self.c.tool_time.sample(self.rng)
        await ctx.sleep(gap)
        return gap

    def fans_out(self, parent: str | None, step: int) -> bool:
        return parent is None and self.c.subagents > 0 and step == self.c.fan_out_step


class _ResponsesLoop(_Loop):
    """Codex-style: Codex's session and thread headers; a subagent forks the parent's latest
    response (`previous_response_id`) as Codex's spawned threads continue its context."""

    def identity(self, name: str, parent: str | None) -> dict[str, str]:
        headers = {"session-id": self.agent_id, "thread-id": name}
        if parent is not None:
            headers["x-codex-parent-thread-id"] = parent
            headers["x-openai-subagent"] = "collab_spawn"
        return headers

    async def run(self, ctx: UnitContext) -> None:
        await self.agent(ctx, self.agent_id, None, self.task, None, self.c.steps, [])

    async def agent(
        self,
        ctx: UnitContext,
        name: str,
        parent: str | None,
        items: list[Message] | str,
        previous: str | None,
        steps: int,
        parents: list[str],
    ) -> str:
        gap, text = 0.0, ""
        for step in range(steps):
            reply = await must(
                ctx,
                self.request(
                    name,
                    parent,
                    step,
                    parents,
                    gap,
                    api="responses",
                    instructions=self.system,
                    input_items=items,
                    previous_response_id=previous,
                ),
            )
            previous, parents, text = reply.response_id, [reply.request_id], reply.text
            outputs = [(f"call_{name}_{step}", self.result(name, step))]
            if self.fans_out(parent, step):
                subs = [f"{name}-sub{i}" for i in range(self.c.subagents)]
                texts = await asyncio.gather(
                    *(
                        self.agent(
                            ctx,
                            sub,
                            name,
                            self.subtask(i),
                            previous,
                            self.c.subagent_steps,
                            parents,
                        )
                        for i, sub in enumerate(subs)
                    )
                )
                outputs = [(f"call_{sub}", t) for sub, t in zip(subs, texts, strict=True)]
            items = [
                {"type": "function_call_output", "call_id": call_id, "output": output}
                for call_id, output in outputs
            ]
            gap = await self.tool(ctx, step, steps)
        return text


class _MessagesLoop(_Loop):
    """Claude Code-style: its session header on every request, the agent header on a
    subagent's; a subagent starts from the parent's whole conversation, with its subtask."""

    def identity(self, name: str, parent: str | None) -> dict[str, str]:
        headers = {"x-claude-code-session-id": self.agent_id}
        if parent is not None:
            headers["x-claude-code-agent-id"] = name
        return headers

    async def run(self, ctx: UnitContext) -> None:
        history: list[Message] = [{"role": "user", "content": self.task}]
        await self.agent(ctx, self.agent_id, None, history, self.c.steps, [])

    async def agent(
        self,
        ctx: UnitContext,
        name: str,
        parent: str | None,
        history: list[Message],
        steps: int,
        parents: list[str],
    ) -> str:
        system = [{"type": "text", "text": self.system, "cache_control": {"type": "ephemeral"}}]
        gap, text = 0.0, ""
        for step in range(steps):
            reply = await must(
                ctx,
                self.request(
                    name,
                    parent,
                    step,
                    parents,
                    gap,
                    api="messages",
                    system=system,
                    messages=list(history),
                ),
            )
            parents, text = [reply.request_id], reply.text
            calls = [(f"toolu_{name}_{step}", self.result(name, step))]
            if self.fans_out(parent, step):
                subs = [f"{name}-sub{i}" for i in range(self.c.subagents)]
                start = [*history, {"role": "assistant", "content": reply.text}]
                texts = await asyncio.gather(
                    *(
                        self.agent(
                            ctx,
                            sub,
                            name,
                            [*start, {"role": "user", "content": self.subtask(i)}],
                            self.c.subagent_steps,
                            parents,
                        )
                        for i, sub in enumerate(subs)
                    )
                )
                calls = [(f"toolu_{sub}", t) for sub, t in zip(subs, texts, strict=True)]
            history.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": reply.text},
                        *(
                            {
                                "type": "tool_use",
                                "id": call_id,
                                "name": "run",
                                "input": {"step": step},
                            }
                            for call_id, _ in calls
                        ),
                    ],
                }
            )
            history.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": call_id, "content": result}
                        for call_id, result in calls
                    ],
                }
            )
            gap = await self.tool(ctx, step, steps)
        return text


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
    g.add_argument(
        "--agent-task-tokens",
        type=positive_int,
        default=d.task_tokens,
        help="each agent's (and subagent's) own task",
    )
    g.add_argument(
        "--agent-result-tokens",
        type=positive_int,
        default=d.result_tokens,
        help="each tool result sent back",
    )
    g.add_argument(
        "--agent-answer-tokens",
        type=positive_int,
        default=d.answer_tokens,
        help="each model answer (max tokens)",
    )
    g.add_argument(
        "--subagents",
        type=non_negative_int,
        default=d.subagents,
        help="subagents each agent spawns in parallel (after its first step)",
    )
    g.add_argument(
        "--subagent-steps",
        type=positive_int,
        default=d.subagent_steps,
        help="model calls per subagent",
    )
    g.add_argument(
        "--agent-identity",
        choices=IDENTITIES,
        default=d.identity,
        help="send the agents' own session headers (native) or hiveroute's X-* headers",
    )
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
            subagents=args.subagents,
            subagent_steps=args.subagent_steps,
            identity=args.agent_identity,
            seed=seed,
            namespace=namespace,
        )
    )
