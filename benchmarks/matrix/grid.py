"""The workload matrix's cells: which workloads, with which parameters, on which fleet.

Four simulated engines (llama-8b-h100, blocks of 16 tokens) in every cell. The full product of
the issue's dimensions is 27 multi-turn and 16 agentic cells; the matrix takes fractions of them
that still see every level of every dimension, and every pair of levels, at least once:

- multi-turn (9 cells): an L9 orthogonal array over shared share {0, 10 %, 50 %} x working set
  {0.5, 0.9, 1.3} of the fleet's KV cache x sessions per engine {2, 8, 32}: cell (i, j) takes
  share i, working set j and sessions level (i + j) mod 3, so each pair of levels of two
  dimensions occurs exactly once (sessions paced as vLLM production-stack's multi-round QA);
  plus the issue's own case as it was run (`mt-issue22`: Poisson arrivals, exp think time);
- agentic (8 cells): the 2^(4-1) half fraction over fan-out {2, 8} x shared context {4k, 32k} x
  tool gap {0.2 s, 5 s} x layout, the layout given by the other three (role first when an odd
  number of them is at its high level): every main effect free of two-factor interactions;
- the Mooncake conversation trace (4 cells): slices of 800 rows from rows 0, 3000, 6000, 9000;
- two router replicas (4 cells): two multi-turn cells, one agentic and one trace slice again,
  every router run as two processes behind a round-robin client.

Time is modelled: a cell's rates, gaps and durations are in the simulator's seconds, and the
matrix runs the simulator (and scales the workload's clock) by `time_scale` (0.5: twice as fast
as modelled), so that a cell takes about a minute of wall time. Trace cells replay at ten times
the trace's speed already and run unscaled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hiveroute.bench.workloads.multiturn import MultiturnConfig
from hiveroute.bench.workloads.trace import full_trace_path

ENGINES = 4
PRESET = "llama-8b-h100"
BLOCK_SIZE = 16
ISSUE_BLOCKS = 4000  # per engine: the issue's fleet (room for about six 10k-token sessions)
FLEET_TOKENS = ENGINES * ISSUE_BLOCKS * BLOCK_SIZE

SHARED_SHARES = (0.0, 0.1, 0.5)
WORKING_SETS = (0.5, 0.9, 1.3)
SESSIONS_PER_ENGINE = (2, 8, 32)
FAN_OUTS = (2, 8)
CONTEXTS = (4096, 32768)
TOOL_GAPS = (0.2, 5.0)
LAYOUTS = ("context_first", "role_first")
TRACE_SKIPS = (0, 3000, 6000, 9000)
REPLICA_CELLS = ("mt-s10-w090-u32", "mt-s50-w050-u32", "ag-f8-c4k-g0.2-role", "tr-0")

# multi-turn sessions: the issue's three requests per second, eight turns of short
# question-and-answer after each user's own history
MT_RATE = 3.0
MT_TURNS = 8
MT_QUESTION = 32
MT_ANSWER = 48
CELL_SECONDS = 120.0  # modelled seconds in which a cell starts new work
GRACE_SECONDS = 20.0  # modelled seconds to finish after

# agentic workflows: fewer of them per second, and more KV blocks per engine, when their context
# is large (a role-first prompt shares nothing across agents inline: at 0.2 workflows/s of 32k
# contexts with fan-out 8 that is twice the fleet's prefill capacity, and every router's TTFT was
# queueing, 15 s; at 0.08/s it is within it). 4,000 blocks hold about 16 contexts of 4k per
# engine, 16,000 about 8 of 32k.
AG_RATE = {4096: 0.5, 32768: 0.08}
AG_BLOCKS = {4096: ISSUE_BLOCKS, 32768: 16000}
AG_ROUNDS = 2
AG_TASK_TOKENS = 256

TRACE_ROWS = 800
TRACE_SPEED = 10.0
TRACE_TOKEN_SCALE = 0.1
TRACE_BLOCKS = 12000  # per engine, as benchmarks/kv_routing.py
TRACE_MAX_OUTPUT = 32


@dataclass(frozen=True)
class Cell:
    """One cell: a workload with its parameters (modelled time), a fleet size, and replicas."""

    name: str
    workload: str  # multiturn | agentic | trace
    params: dict[str, Any] = field(hash=False)
    blocks: int  # KV blocks per engine
    replicas: int = 1
    fits: bool = False  # the working set fits the fleet's KV caches (the ideal's target applies)
    scaled: bool = True  # run at the matrix's time scale (trace cells replay at their own speed)

    @property
    def role_first(self) -> bool:
        return self.workload == "agentic" and self.params.get("layout") == "role_first"

    def describe(self) -> str:
        keys = {
            "multiturn": ("system_share", "working_set", "sessions_per_engine"),
            "agentic": ("fan_out", "context_tokens", "tool_gap_s", "layout"),
            "trace": ("trace_skip",),
        }[self.workload]
        text = ", ".join(f"{k}={self.params[k]}" for k in keys if k in self.params)
        return text + (f", {self.replicas} replicas" if self.replicas > 1 else "")


def fits_fleet(shared_tokens: float, own_tokens: float, fleet_tokens: int = FLEET_TOKENS) -> bool:
    """Whether the active sessions fit the fleet's caches: each session's own part once, and
    the prompt they all share once per engine. A working set counted with the shared prompt
    once fits the one-cache ideal, not four caches: an engine serving sessions holds its own
    copy of the shared prompt (in mt-s50-w090-u2, a 25,600-token system prompt and 2 sessions
    of 25,600 own tokens per engine need 76,800 tokens of an engine's 64,000)."""
    return shared_tokens * ENGINES + own_tokens <= fleet_tokens


def multiturn_cell(
    name: str,
    share: float,
    working_set: float,
    sessions_per_engine: int,
    *,
    conversation_tokens: int | None = None,
    active_users: int | None = None,
    turns: int = MT_TURNS,
    question: int = MT_QUESTION,
    answer: int = MT_ANSWER,
    rate: float = MT_RATE,
    blocks: int = ISSUE_BLOCKS,
) -> Cell:
    """Sessions sized so that the distinct tokens of those active at once (the shared system
    prompt once, each session's own part) are `working_set` of the fleet's KV cache."""
    users = active_users or ENGINES * sessions_per_engine
    fleet = ENGINES * blocks * BLOCK_SIZE
    if conversation_tokens is None:
        conversation_tokens = math.floor(working_set * fleet / (share + users * (1 - share)))
    interval = users / rate
    lifetime = turns * interval
    generations = math.ceil(CELL_SECONDS / lifetime) + 1
    params = {
        "system_share": share,
        "working_set": working_set,
        "sessions_per_engine": sessions_per_engine,
        "active_users": users,
        "users": users * generations,
        "request_rate": rate,
        "turns": turns,
        "conversation_tokens": conversation_tokens,
        "question_tokens": question,
        "answer_tokens": answer,
    }
    shared = share * conversation_tokens
    own = users * (1 - share) * conversation_tokens
    return Cell(name, "multiturn", params, blocks, fits=fits_fleet(shared, own, fleet))


def multiturn_cells() -> list[Cell]:
    cells = []
    for i, share in enumerate(SHARED_SHARES):
        for j, working_set in enumerate(WORKING_SETS):
            spe = SESSIONS_PER_ENGINE[(i + j) % 3]
            name = f"mt-s{share * 100:02.0f}-w{working_set * 100:03.0f}-u{spe}"
            cells.append(multiturn_cell(name, share, working_set, spe))
    cells.append(issue_cell())
    return cells


def issue_cell() -> Cell:
    """The case issue 22 was filed on, as it was run: 4,000 blocks per engine, 34 users arriving
    at 0.35/s (about 20 at once), 10 turns with exp:5 s of thought between them (about 3
    requests/s), a 1k-token system prompt shared by all and 8.5k tokens of each user's own
    history (conversations of about 10k tokens). `workflow` and `kv` sent 3 of 341 requests to
    one engine there."""
    users, system, history, turns = 34, 1000, 8500, 10
    question, answer = MultiturnConfig.question_tokens, MultiturnConfig.answer_tokens
    conversation = system + history + MultiturnConfig.ACK_TOKENS + turns * (question + answer)
    active = 20  # 0.35 sessions/s x 10 turns x (5 s + ~0.7 s each)
    distinct = system + active * (conversation - system)
    params = {
        "system_share": round(system / conversation, 3),
        "working_set": round(distinct / FLEET_TOKENS, 2),
        "sessions_per_engine": active // ENGINES,
        "users": users,
        "session_rate": 0.35,
        "think_time_s": 5.0,
        "turns": turns,
        "system_tokens": system,
        "history_tokens": history,
        "question_tokens": question,
        "answer_tokens": answer,
        "duration_s": 180.0,
    }
    own = active * (conversation - system)
    return Cell("mt-issue22", "multiturn", params, ISSUE_BLOCKS, fits=fits_fleet(system, own))


def agentic_cells() -> list[Cell]:
    cells = []
    for a, fan in enumerate(FAN_OUTS):
        for b, context in enumerate(CONTEXTS):
            for c, gap in enumerate(TOOL_GAPS):
                layout = LAYOUTS[(a + b + c) % 2]
                name = f"ag-f{fan}-c{context // 1024}k-g{gap:g}-{layout.split('_')[0]}"
                params = {
                    "fan_out": fan,
                    "context_tokens": context,
                    "tool_gap_s": gap,
                    "layout": layout,
                    "rate": AG_RATE[context],
                    "workflows": math.ceil(AG_RATE[context] * CELL_SECONDS) + 1,
                    "rounds": AG_ROUNDS,
                }
                cells.append(Cell(name, "agentic", params, AG_BLOCKS[context]))
    return cells


def trace_cells() -> list[Cell]:
    return [
        Cell(f"tr-{skip}", "trace", {"trace_skip": skip}, TRACE_BLOCKS, scaled=False)
        for skip in TRACE_SKIPS
    ]


def replica_cells(base: list[Cell]) -> list[Cell]:
    by_name = {c.name: c for c in base}
    return [
        Cell(
            f"{name}-x2",
            by_name[name].workload,
            by_name[name].params,
            by_name[name].blocks,
            replicas=2,
            fits=by_name[name].fits,
            scaled=by_name[name].scaled,
        )
        for name in REPLICA_CELLS
    ]


def all_cells() -> list[Cell]:
    """Every cell of the matrix, in the order they run."""
    base = multiturn_cells() + agentic_cells() + trace_cells()
    return base + replica_cells(base)


def workload_args(cell: Cell, time_scale: float, seed: int) -> list[str]:
    """The `hiveroute bench run` arguments of the cell's workload and driver (not targets)."""
    p = cell.params
    scale = time_scale if cell.scaled else 1.0
    argv = ["--workload", cell.workload, "--seed", str(seed)]
    duration = p.get("duration_s", CELL_SECONDS)
    argv += ["--duration", _g(duration * scale), "--grace", _g(GRACE_SECONDS * scale)]
    if cell.workload == "multiturn" and "session_rate" in p:
        argv += ["--users", str(p["users"]), "--turns", str(p["turns"])]
        argv += ["--system-tokens", str(p["system_tokens"])]
        argv += ["--history-tokens", str(p["history_tokens"])]
        argv += ["--question-tokens", str(p["question_tokens"])]
        argv += ["--answer-tokens", str(p["answer_tokens"])]
        argv += ["--session-rate", _g(p["session_rate"] / scale)]
        argv += ["--think-time", f"exp:{_g(p['think_time_s'] * scale)}"]
    elif cell.workload == "multiturn":
        argv += ["--users", str(p["users"]), "--turns", str(p["turns"])]
        argv += ["--conversation-tokens", str(p["conversation_tokens"])]
        argv += ["--system-share", _g(p["system_share"])]
        argv += ["--question-tokens", str(p["question_tokens"])]
        argv += ["--answer-tokens", str(p["answer_tokens"])]
        argv += ["--active-users", str(p["active_users"])]
        argv += ["--request-rate", _g(p["request_rate"] / scale)]
    elif cell.workload == "agentic":
        argv += ["--workflows", str(p["workflows"]), "--workflow-rate", _g(p["rate"] / scale)]
        argv += ["--fan-out", str(p["fan_out"]), "--rounds", str(p["rounds"])]
        argv += ["--task-tokens", str(AG_TASK_TOKENS)]
        argv += ["--kb-tokens", str(p["context_tokens"] - AG_TASK_TOKENS)]
        argv += ["--tool-gap", f"exp:{_g(p['tool_gap_s'] * scale)}", "--layout", p["layout"]]
    else:
        argv += ["--trace", str(full_trace_path())]  # slices past the bundled 1000 rows
        argv += ["--trace-skip", str(p["trace_skip"]), "--trace-limit", str(TRACE_ROWS)]
        argv += ["--trace-speed", _g(TRACE_SPEED), "--token-scale", _g(TRACE_TOKEN_SCALE)]
        argv += ["--max-output-tokens", str(TRACE_MAX_OUTPUT)]
    return argv


def fleet_args(cell: Cell, time_scale: float, *, ideal: bool = False) -> list[str]:
    """The engines' arguments. The ideal is one engine with the fleet's cache that also runs
    ENGINES times faster (benchmarks/kv_routing.py's reference: every prefix found wherever it
    was computed, without one engine's queue deciding what stays cached)."""
    scale = time_scale if cell.scaled else 1.0
    engines, blocks = (1, cell.blocks * ENGINES) if ideal else (ENGINES, cell.blocks)
    if ideal:
        scale /= ENGINES
    argv = ["--engines", "sim", "--num-engines", str(engines), "--preset", PRESET]
    argv += ["--block-size", str(BLOCK_SIZE), "--sim-option", f"num_blocks={blocks}"]
    return [*argv, "--sim-option", f"time_scale={_g(scale)}"]


def _g(value: float) -> str:
    return f"{value:.6g}"


def select(cells: list[Cell], names: list[str] | None) -> list[Cell]:
    """The named cells (a name may end in * to match a prefix), in matrix order."""
    if not names:
        return cells
    chosen = []
    for cell in cells:
        for name in names:
            if cell.name == name or (name.endswith("*") and cell.name.startswith(name[:-1])):
                chosen.append(cell)
                break
    unknown = [
        n for n in names if not any(c.name == n or c.name.startswith(n.rstrip("*")) for c in cells)
    ]
    if unknown:
        raise ValueError(f"unknown cells: {', '.join(unknown)}")
    return chosen
