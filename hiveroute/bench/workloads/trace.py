"""`trace`: replay a Mooncake-format trace at its own pace or scaled.

Each line is ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``;
a hash id names one 512-token block *and everything before it*. The prompt of a request is the
concatenation of one text block per hash id, each made from its id alone, so equal ids give
equal token blocks (and equal prefixes) and unequal ids give blocks that differ in their first
token. The last block is cut to the request's length.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hiveroute.bench.workloads.base import (
    BenchRequest,
    Unit,
    UnitContext,
    must,
    non_negative_int,
    positive_float,
    positive_int,
)
from hiveroute.bench.workloads.text import labelled_filler
from hiveroute.errors import ConfigError

TRACE_BLOCK_TOKENS = 512
DEFAULT_TRACE = Path("shared/data/mooncake/conversation_trace.jsonl")


@dataclass(frozen=True)
class TraceRow:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass
class TraceConfig:
    path: Path
    limit: int = 200
    skip: int = 0  # rows skipped before the replay starts (a later slice of the trace)
    speed: float = 1.0  # 2.0 replays twice as fast
    token_scale: float = 1.0  # shrink prompts and outputs, keeping the block structure
    max_output_tokens: int = 0  # 0 = as in the trace
    seed: int = 0
    namespace: str = ""

    @property
    def block_tokens(self) -> int:
        scaled = round(TRACE_BLOCK_TOKENS * self.token_scale)
        return max(2, scaled + scaled % 2)  # even, so blocks end in a space and join cleanly


BUNDLED_TRACE = (
    Path(__file__).resolve().parent.parent / "data" / "mooncake_conversation_trace_1000.jsonl"
)


def default_trace_path() -> Path:
    """$HIVEROUTE_TRACE, else the first 1000 rows of the Mooncake conversation trace that ship
    with the package (hiveroute/bench/data, Apache-2.0), so `--workload trace` works anywhere."""
    env = os.environ.get("HIVEROUTE_TRACE")
    if env:
        return Path(env)
    return BUNDLED_TRACE


def full_trace_path() -> Path:
    """The whole Mooncake trace (12,031 rows) for benchmarks that replay later slices:
    $HIVEROUTE_TRACE, else ../shared/data/mooncake/ next to the repository, else the bundled
    slice. Download: github.com/kvcache-ai/Mooncake, FAST25-release/traces/conversation_trace.jsonl."""
    env = os.environ.get("HIVEROUTE_TRACE")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for root in (Path.cwd(), *here.parents):
        for up in (root.parent, root.parent.parent):
            candidate = up / DEFAULT_TRACE
            if candidate.exists():
                return candidate
    return BUNDLED_TRACE


def read_trace(path: Path, limit: int, skip: int = 0) -> list[TraceRow]:
    """`limit` rows (0 = all) of a Mooncake trace after the first `skip`; a bad line is a
    ConfigError. A later slice replays requests whose earlier turns are not replayed: their
    shared blocks are misses for every target alike."""
    rows: list[TraceRow] = []
    try:
        handle = path.open()
    except OSError as exc:
        raise ConfigError(
            f"cannot read trace {path}: {exc.strerror}; give one with --trace FILE"
        ) from None
    with handle:
        seen = 0
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            seen += 1
            if seen <= skip:
                continue
            try:
                obj = json.loads(line)
                row = TraceRow(
                    timestamp_ms=float(obj["timestamp"]),
                    input_length=int(obj["input_length"]),
                    output_length=int(obj["output_length"]),
                    hash_ids=tuple(int(h) for h in obj["hash_ids"]),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"{path}:{number}: not a Mooncake trace line (timestamp, input_length, "
                    f"output_length, hash_ids): {exc}"
                ) from None
            if row.input_length <= 0 or row.output_length < 0 or not row.hash_ids:
                raise ConfigError(f"{path}:{number}: lengths must be positive, hash_ids non-empty")
            rows.append(row)
            if limit and len(rows) >= limit:
                break
    if not rows:
        after = f" after the first {skip}" if skip else ""
        hint = (
            "; the bundled slice has 1000 rows: give the full trace with --trace FILE"
            if path == BUNDLED_TRACE
            else ""
        )
        raise ConfigError(f"trace {path} has no requests{after}{hint}")
    return rows


class TraceWorkload:
    name = "trace"

    def __init__(self, config: TraceConfig, rows: list[TraceRow] | None = None) -> None:
        self.config = config
        self.rows = rows if rows is not None else read_trace(config.path, config.limit, config.skip)

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {
            "workload": self.name,
            "path": str(c.path),
            "requests": len(self.rows),
            "limit": c.limit,
            "skip": c.skip,
            "speed": c.speed,
            "token_scale": c.token_scale,
            "block_tokens": c.block_tokens,
            "max_output_tokens": c.max_output_tokens,
            "namespace": c.namespace,
        }

    def block_text(self, hash_id: int, n_tokens: int) -> str:
        """The first `n_tokens` tokens of block `hash_id` (a prefix of the whole block)."""
        return labelled_filler(f"blk{hash_id}", n_tokens, "trace-block", hash_id)

    def prompt(self, row: TraceRow) -> str:
        c = self.config
        block = c.block_tokens
        length = max(1, round(row.input_length * c.token_scale))
        parts = [c.namespace + " "] if c.namespace else []
        for i, hash_id in enumerate(row.hash_ids):
            remaining = length - i * block
            if remaining <= 0:
                break
            parts.append(self.block_text(hash_id, min(block, remaining)))
        return "".join(parts)

    def max_tokens(self, row: TraceRow) -> int:
        c = self.config
        out = max(1, round(row.output_length * c.token_scale))
        return min(out, c.max_output_tokens) if c.max_output_tokens else out

    def units(self) -> Iterator[Unit]:
        start = self.rows[0].timestamp_ms
        for index, row in enumerate(self.rows):
            request = BenchRequest(max_tokens=self.max_tokens(row), prompt=self.prompt(row))

            async def run(ctx: UnitContext, request: BenchRequest = request) -> None:
                await must(ctx, request)

            yield Unit(
                unit_id=f"trace-{self.config.skip + index}",  # the row's number in the file
                kind="request",
                arrival_s=max(0.0, row.timestamp_ms - start) / 1000.0 / self.config.speed,
                program=run,
                planned_requests=1,
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("trace workload")
    g.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="FILE",
        help="Mooncake-format JSONL trace (default: the first 1000 rows of Mooncake's "
        "conversation trace, bundled; $HIVEROUTE_TRACE overrides)",
    )
    g.add_argument(
        "--trace-limit", type=non_negative_int, default=200, help="requests to replay (0 = all)"
    )
    g.add_argument(
        "--trace-skip",
        type=non_negative_int,
        default=0,
        help="rows to skip before replaying (replay a later slice of the trace)",
    )
    g.add_argument(
        "--trace-speed", type=positive_float, default=1.0, help="replay speed (2 = twice as fast)"
    )
    g.add_argument(
        "--token-scale",
        type=positive_float,
        default=1.0,
        help="multiply prompt and output lengths (and the 512-token block) by this",
    )
    g.add_argument(
        "--max-output-tokens", type=positive_int, default=None, help="cap each request's output"
    )


def from_args(args: argparse.Namespace, seed: int, namespace: str) -> TraceWorkload:
    return TraceWorkload(
        TraceConfig(
            path=args.trace or default_trace_path(),
            limit=args.trace_limit,
            skip=args.trace_skip,
            speed=args.trace_speed,
            token_scale=args.token_scale,
            max_output_tokens=args.max_output_tokens or 0,
            seed=seed,
            namespace=namespace,
        )
    )
