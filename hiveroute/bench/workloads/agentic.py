"""`agentic`: concurrent multi-agent workflows that share a large context.

Each workflow runs several rounds of planner → a fan-out of executors in parallel (each calling a
tool between its model calls) → validator. Every agent sees the workflow's shared context (a task
and a knowledge base) plus its own system prompt and its own growing history. The `layout` switch
puts the shared context first (agents of a workflow share a long prefix) or each agent's role
first (agents share only their role's prompt across workflows): issue 6 compares the two.

With `context_refs` (hiveroute targets only) a workflow registers its shared context once with
the router (a workflow with the shared-prefix layout, and the context scoped to it), each request
references it (``hiveroute.context_refs``) instead of carrying its text, and the router puts it
first in every prompt of the workflow; the workflow is ended when it is done.
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
from hiveroute.bench.workloads.text import filler, labelled_filler, rng_for

LAYOUTS = ("context_first", "role_first")


@dataclass
class AgenticConfig:
    workflows: int = 8
    rate: float = 0.5  # workflow arrivals per second; 0 = all at once
    fan_out: int = 3
    rounds: int = 2
    task_tokens: int = 256
    kb_tokens: int = 2048
    role_tokens: int = 192
    step_tokens: int = 48  # each instruction a step adds to an agent's history
    tool_result_tokens: int = 128
    planner_tokens: int = 64
    executor_tokens: int = 96
    validator_tokens: int = 32
    tool_calls: int = 1  # per executor per round
    tool_gap: GapDistribution = field(default_factory=lambda: GapDistribution("exp", 0.5))
    layout: str = "context_first"
    seed: int = 0
    namespace: str = ""  # a word put first in every prompt, to keep runs' caches apart
    context_refs: bool = False

    def requests_per_workflow(self) -> int:
        return self.rounds * (2 + self.fan_out * (self.tool_calls + 1))


class AgenticWorkload:
    name = "agentic"

    def __init__(self, config: AgenticConfig) -> None:
        if config.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}")
        self.config = config

    def describe(self) -> dict[str, Any]:
        described = asdict(self.config)
        described["tool_gap"] = str(self.config.tool_gap)
        return {"workload": self.name, **described}

    def units(self) -> Iterator[Unit]:
        c = self.config
        arrivals = poisson_arrivals(c.rate, c.workflows, c.seed, "agentic")
        for index, arrival in enumerate(arrivals):
            workflow_id = f"wf-{c.seed}-{index}"
            yield Unit(
                unit_id=workflow_id,
                kind="workflow",
                arrival_s=arrival,
                program=_WorkflowProgram(c, index, workflow_id).run,
                planned_requests=c.requests_per_workflow(),
            )

    # Exposed for tests and for issue 6's layout comparison.
    def system_prompt(self, index: int, role: str, agent: str) -> str:
        return _WorkflowProgram(self.config, index, f"wf-{self.config.seed}-{index}").system(
            role, agent
        )


class _WorkflowProgram:
    def __init__(self, config: AgenticConfig, index: int, workflow_id: str) -> None:
        self.c = config
        self.index = index
        self.workflow_id = workflow_id
        seed = config.seed
        # The shared context: a task and a knowledge base, unique to this workflow.
        self.context = (
            labelled_filler(f"task{seed}x{index}", config.task_tokens, seed, index, "task")
            + "\n"
            + filler(config.kb_tokens, seed, index, "kb")
        )

    def role_prompt(self, role: str, agent: str) -> str:
        # The role's instructions are the same in every workflow; an executor's specialty differs.
        base = labelled_filler(f"role{role}", self.c.role_tokens, "role", role)
        if role == "executor":
            base += "\n" + labelled_filler(f"specialty{agent.replace('-', '')}", 16, "agent", agent)
        return base

    @property
    def context_id(self) -> str:
        return f"{self.workflow_id}-context"

    def registered_context(self) -> str:
        """The context as registered (the run's namespace first, as in an inline prompt)."""
        lead = (self.c.namespace + "\n") if self.c.namespace else ""
        return lead + self.context

    def system(self, role: str, agent: str) -> str:
        lead = (self.c.namespace + "\n") if self.c.namespace else ""
        role_text = self.role_prompt(role, agent)
        if self.c.context_refs:
            return role_text  # the router puts the registered context (and namespace) first
        if self.c.layout == "context_first":
            return f"{lead}{self.context}\n{role_text}"
        return f"{lead}{role_text}\n{self.context}"

    def request(
        self,
        role: str,
        agent: str,
        history: list[Message],
        max_tokens: int,
        stage: str,
        parents: list[str],
        gap: float = 0.0,
    ) -> BenchRequest:
        messages = [{"role": "system", "content": self.system(role, agent)}, *history]
        return BenchRequest(
            max_tokens=max_tokens,
            messages=messages,
            workflow_id=self.workflow_id,
            agent_id=f"{self.workflow_id}/{agent}",
            agent_role=role,
            stage=stage,
            parents=list(parents),
            planned_gap_s=gap,
            context_refs=[self.context_id] if self.c.context_refs else [],
        )

    def instruction(self, label: str, *key: object) -> str:
        return labelled_filler(label, self.c.step_tokens, self.c.seed, self.index, *key)

    async def run(self, ctx: UnitContext) -> None:
        if not self.c.context_refs:
            await self._rounds(ctx)
            return
        await ctx.control(
            "POST", "/v1/workflows", {"id": self.workflow_id, "shared_prefix_layout": True}
        )
        await ctx.control(
            "POST",
            "/v1/contexts",
            {
                "id": self.context_id,
                "text": self.registered_context(),
                "workflow_id": self.workflow_id,
            },
        )
        await self._rounds(ctx)
        await ctx.control("DELETE", f"/v1/workflows/{self.workflow_id}")

    async def _rounds(self, ctx: UnitContext) -> None:
        c = self.c
        planner: list[Message] = []
        validator: list[Message] = []
        executors: list[list[Message]] = [[] for _ in range(c.fan_out)]
        parents: list[str] = []
        feedback = ""
        for rnd in range(c.rounds):
            stage = f"round{rnd + 1}"
            planner.append(
                {"role": "user", "content": feedback + self.instruction("plan", rnd, "plan")}
            )
            plan = await must(
                ctx, self.request("planner", "planner", planner, c.planner_tokens, stage, parents)
            )
            planner.append({"role": "assistant", "content": plan.text})
            results = await asyncio.gather(
                *(
                    self._executor(ctx, i, executors[i], plan.text, plan.request_id, rnd, stage)
                    for i in range(c.fan_out)
                )
            )
            report = "\n".join(f"result {i}: {text}" for i, (_, text) in enumerate(results))
            validator.append(
                {"role": "user", "content": self.instruction("check", rnd) + "\n" + report}
            )
            verdict = await must(
                ctx,
                self.request(
                    "validator",
                    "validator",
                    validator,
                    c.validator_tokens,
                    stage,
                    [rid for rid, _ in results],
                ),
            )
            validator.append({"role": "assistant", "content": verdict.text})
            feedback = f"feedback: {verdict.text}\n"
            parents = [verdict.request_id]

    async def _executor(
        self,
        ctx: UnitContext,
        i: int,
        history: list[Message],
        plan: str,
        plan_id: str,
        rnd: int,
        stage: str,
    ) -> tuple[str, str]:
        c = self.c
        agent = f"executor-{i}"
        history.append(
            {"role": "user", "content": self.instruction(f"subtask{i}", rnd, i) + "\n" + plan}
        )
        parents, gap = [plan_id], 0.0
        rng = rng_for("toolgap", c.seed, self.index, rnd, i)
        for call in range(c.tool_calls + 1):
            reply = await must(
                ctx,
                self.request("executor", agent, history, c.executor_tokens, stage, parents, gap),
            )
            history.append({"role": "assistant", "content": reply.text})
            if call == c.tool_calls:
                return reply.request_id, reply.text
            gap = c.tool_gap.sample(rng)
            await ctx.sleep(gap)
            result = labelled_filler(
                "toolresult", c.tool_result_tokens, c.seed, self.index, rnd, i, call
            )
            history.append({"role": "user", "content": result})
            parents = [reply.request_id]
        raise AssertionError("unreachable")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = AgenticConfig()
    g = parser.add_argument_group("agentic workload")
    g.add_argument("--workflows", type=positive_int, default=d.workflows, help="workflows to run")
    g.add_argument(
        "--workflow-rate",
        type=non_negative_float,
        default=d.rate,
        help="workflow arrivals per second (Poisson; 0 = all at once)",
    )
    g.add_argument("--fan-out", type=positive_int, default=d.fan_out, help="executors per round")
    g.add_argument("--rounds", type=positive_int, default=d.rounds, help="rounds per workflow")
    g.add_argument(
        "--task-tokens", type=non_negative_int, default=d.task_tokens, help="task description size"
    )
    g.add_argument(
        "--kb-tokens", type=non_negative_int, default=d.kb_tokens, help="knowledge base size"
    )
    g.add_argument(
        "--role-tokens", type=non_negative_int, default=d.role_tokens, help="system prompt size"
    )
    g.add_argument(
        "--step-tokens",
        type=non_negative_int,
        default=d.step_tokens,
        help="instruction each step adds to an agent's history",
    )
    g.add_argument(
        "--tool-result-tokens",
        type=non_negative_int,
        default=d.tool_result_tokens,
        help="size of each tool call's result",
    )
    g.add_argument(
        "--planner-tokens",
        type=positive_int,
        default=d.planner_tokens,
        help="planner output tokens",
    )
    g.add_argument(
        "--executor-tokens",
        type=positive_int,
        default=d.executor_tokens,
        help="executor output tokens per model call",
    )
    g.add_argument(
        "--validator-tokens",
        type=positive_int,
        default=d.validator_tokens,
        help="validator output tokens",
    )
    g.add_argument(
        "--tool-calls", type=non_negative_int, default=d.tool_calls, help="per executor per round"
    )
    g.add_argument(
        "--tool-gap",
        type=gap_distribution,
        default=d.tool_gap,
        metavar="KIND:MEAN_S",
        help="tool-call time: const|exp|uniform|lognormal:SECONDS (default exp:0.5)",
    )
    g.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=d.layout,
        help="prompt layout: shared context first, or each agent's role first",
    )
    g.add_argument(
        "--context-refs",
        action="store_true",
        help="hiveroute targets only: register each workflow's shared context once (a workflow "
        "with the shared-prefix layout) and reference it from every request instead of sending "
        "its text; the router puts it first in every prompt",
    )


def from_args(args: argparse.Namespace, seed: int, namespace: str) -> AgenticWorkload:
    return AgenticWorkload(
        AgenticConfig(
            workflows=args.workflows,
            rate=args.workflow_rate,
            fan_out=args.fan_out,
            rounds=args.rounds,
            task_tokens=args.task_tokens,
            kb_tokens=args.kb_tokens,
            role_tokens=args.role_tokens,
            step_tokens=args.step_tokens,
            tool_result_tokens=args.tool_result_tokens,
            planner_tokens=args.planner_tokens,
            executor_tokens=args.executor_tokens,
            validator_tokens=args.validator_tokens,
            tool_calls=args.tool_calls,
            tool_gap=args.tool_gap,
            layout=args.layout,
            seed=seed,
            namespace=namespace,
            context_refs=args.context_refs,
        )
    )
