"""Where a request's time outside the engine goes: inside hiveroute's handler, or before and
after it.

A matrix or `hiveroute bench` run keeps the client's TTFT per request (`requests.jsonl`) and,
at `--router-log-level info`, the router's access log (`logs/target-*.log`): its own TTFT, from
the moment its handler took the request to the first chunk it relayed, and `overhead_ms`, from
that moment to the first byte sent upstream. The client's TTFT minus the router's is the time
the request spent in sockets and waiting for the router's event loop to read it or write the
answer; in bursts, that wait is the CPU of the requests ahead of it.

    PYTHONPATH=. python -m benchmarks.router_time_split RUN_DIR [RUN_DIR ...] [--report NAME]
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import write_report
from hiveroute.bench.summary import percentile
from hiveroute.gateway.access_log import ACCESS_LOGGER


@dataclass(frozen=True)
class TimeSplit:
    """One run's requests that both the client and the router timed, in milliseconds."""

    run: str
    requests: int
    client_ttft_mean: float
    router_ttft_mean: float
    outside: list[float]  # client TTFT - router TTFT, per request
    in_handler: list[float]  # the router's arrival-to-upstream-send time, per request
    sent_before: list[int]  # requests the client sent in the BURST_S before this one, per request


BURST_S = 0.020
BURSTS = ((0, 0, "none"), (1, 2, "1-2"), (3, 5, "3-5"), (6, 10**9, "6+"))


def _p90(values: Sequence[float]) -> float:
    found = percentile(values, 90)
    if found is None:  # split() refuses a run without requests, so never
        raise ValueError("no values")
    return found


def _access_lines(log_dir: Path) -> Iterable[dict[str, object]]:
    for path in sorted(log_dir.glob("target-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if ACCESS_LOGGER not in line:
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict) and entry.get("logger") == ACCESS_LOGGER:
                yield entry


def split(run_dir: Path) -> TimeSplit:
    """Match the client's and the router's record of each request by its id."""
    client: dict[str, tuple[float, float]] = {}  # id: (TTFT ms, send time s)
    for line in (run_dir / "requests.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("status") == 200 and record.get("ttft_s") is not None:
            sent = float(record.get("t_send_s") or 0.0)
            client[str(record["request_id"])] = (float(record["ttft_s"]) * 1000, sent)
    sends = sorted(sent for _, sent in client.values())
    outside: list[float] = []
    in_handler: list[float] = []
    router_ttft: list[float] = []
    client_ttft: list[float] = []
    sent_before: list[int] = []
    for entry in _access_lines(run_dir / "logs"):
        seen = client.get(str(entry.get("request_id")))
        ttft, overhead = entry.get("ttft_ms"), entry.get("overhead_ms")
        if (
            seen is None
            or not isinstance(ttft, int | float)
            or not isinstance(overhead, int | float)
        ):
            continue
        ttft_ms, sent = seen
        client_ttft.append(ttft_ms)
        router_ttft.append(float(ttft))
        outside.append(ttft_ms - float(ttft))
        in_handler.append(float(overhead))
        window = bisect.bisect_right(sends, sent) - bisect.bisect_left(sends, sent - BURST_S)
        sent_before.append(window - 1)  # itself excluded
    if not outside:
        raise SystemExit(
            f"{run_dir}: no request timed by both the client and the router "
            "(was the run made with --router-log-level info against a hiveroute target?)"
        )
    return TimeSplit(
        run_dir.name,
        len(outside),
        statistics.fmean(client_ttft),
        statistics.fmean(router_ttft),
        outside,
        in_handler,
        sent_before,
    )


def table(splits: Sequence[TimeSplit]) -> str:
    rows = [
        "| run | requests | client TTFT mean | router TTFT mean | outside the handler p50 / mean / p90 | in the handler p50 / mean / p90 |",
        "|---|---:|---:|---:|---|---|",
    ]
    for s in splits:
        out = f"{statistics.median(s.outside):.1f} / {statistics.fmean(s.outside):.1f} / {_p90(s.outside):.1f}"
        inside = f"{statistics.median(s.in_handler):.2f} / {statistics.fmean(s.in_handler):.2f} / {_p90(s.in_handler):.2f}"
        rows.append(
            f"| {s.run} | {s.requests} | {s.client_ttft_mean:.1f} | {s.router_ttft_mean:.1f} | {out} | {inside} |"
        )
    rows += [
        "",
        f"Outside the handler, median ms (requests), by how many requests the client sent in the "
        f"{BURST_S * 1000:.0f} ms before:",
        "",
        "| run | " + " | ".join(name for _, _, name in BURSTS) + " |",
        "|---|" + "---:|" * len(BURSTS),
    ]
    for s in splits:
        cells = []
        for low, high, _ in BURSTS:
            waits = [w for w, n in zip(s.outside, s.sent_before, strict=True) if low <= n <= high]
            cells.append(f"{statistics.median(waits):.1f} ({len(waits)})" if waits else "–")
        rows.append(f"| {s.run} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n\nAll times in ms.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "runs", nargs="+", type=Path, help="run directories (requests.jsonl, logs/)"
    )
    parser.add_argument("--report", help="also write benchmarks/results/REPORT.md")
    args = parser.parse_args()
    text = table([split(run) for run in args.runs])
    print(text)
    if args.report:
        path = write_report(args.report, "Where the router-added time goes", text)
        print(f"report: {path}")


if __name__ == "__main__":
    main()
