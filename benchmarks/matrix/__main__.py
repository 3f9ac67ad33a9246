"""The workload matrix (issue 22): every router on every cell, three seeds, a fresh fleet each.

    PYTHONPATH=. python -m benchmarks.matrix                      # all of it (hours), resumable
    PYTHONPATH=. python -m benchmarks.matrix --cells 'mt-*' --seeds 0
    PYTHONPATH=. python -m benchmarks.matrix --list               # the grid, nothing run
    PYTHONPATH=. python -m benchmarks.matrix --summarize-only     # rebuild matrix.md

Each run's figures go into benchmarks/results/matrix/CELL.json as soon as it ends, and a run
already there is not repeated; the report (benchmarks/results/matrix.md) is rebuilt from all
the cell files after every cell. The grid is defined in `grid.py`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from benchmarks.cli import comma_ints, comma_list
from benchmarks.matrix.grid import ENGINES, all_cells, select
from benchmarks.matrix.report import build
from benchmarks.matrix.runner import ROUTERS, plan, run_one
from benchmarks.matrix.store import CellStore, pending
from benchmarks.report import REPORTS, write_report
from hiveroute.config import LOG_LEVELS

CELL_DIR = REPORTS / "matrix"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.matrix", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--cells",
        type=comma_list,
        default=None,
        help="comma-separated cell names (NAME* for a prefix); default all",
    )
    parser.add_argument(
        "--routers",
        type=comma_list,
        default=list(ROUTERS),
        help=f"comma-separated; default {','.join(ROUTERS)}",
    )
    parser.add_argument(
        "--seeds",
        type=comma_ints,
        default=[0, 1, 2],
        help="comma-separated (default 0,1,2)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=0.5,
        help="simulator and workload clock: wall seconds per modelled second (default 0.5)",
    )
    parser.add_argument(
        "--no-refs",
        action="store_true",
        help="no hiveroute:workflow+refs runs in role-first agentic cells",
    )
    parser.add_argument(
        "--no-ideal", action="store_true", help="no one-cache ideal runs where the working set fits"
    )
    parser.add_argument(
        "--router-log-level",
        choices=LOG_LEVELS,
        default="warning",
        help="hiveroute routers' log level; info keeps each decision in the runs' logs",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=CELL_DIR,
        help="per-cell JSON directory; the report is written beside it as DIR.md",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/matrix"),
        help="the runs' own directories (records, plots)",
    )
    parser.add_argument(
        "--summarize-only",
        action="store_true",
        help="only rebuild the report from the per-cell JSON",
    )
    parser.add_argument(
        "--list", action="store_true", help="print the cells and their runs; run nothing"
    )
    args = parser.parse_args(argv)
    if not 0 < args.time_scale <= 10:
        parser.error("--time-scale must be in (0, 10]")

    try:
        cells = select(all_cells(), args.cells)
    except ValueError as exc:
        parser.error(str(exc))
    store = CellStore(args.results)
    runs = {
        c.name: plan(c, args.routers, refs=not args.no_refs, ideal=not args.no_ideal) for c in cells
    }
    if args.list:
        for c in cells:
            print(f"{c.name:28} {c.describe()}\n{'':28} {', '.join(runs[c.name])}")
        todo = pending(store, [c.name for c in cells], runs, args.seeds)
        print(f"\n{len(cells)} cells, {len(todo)} runs to do")
        return 0
    if not args.summarize_only:
        by_name = {c.name: c for c in cells}
        todo = pending(store, list(by_name), runs, args.seeds)
        print(f"{len(todo)} runs to do", file=sys.stderr)
        command = shlex.join(["python", "-m", "benchmarks.matrix", *(argv or sys.argv[1:])])
        last_cell = None
        for i, (name, router, seed) in enumerate(todo, 1):
            if last_cell not in (None, name):
                summarize(store, args.results)
            last_cell = name
            cell = by_name[name]
            started = time.monotonic()
            print(f"[{i}/{len(todo)}] {name} {router} seed {seed}", file=sys.stderr, flush=True)
            result = run_one(cell, router, seed, args.time_scale, args.out, args.router_log_level)
            result["elapsed_s"] = round(time.monotonic() - started, 1)
            info = {
                "workload": cell.workload,
                "describe": cell.describe(),
                "params": cell.params,
                "blocks": cell.blocks,
                "replicas": cell.replicas,
                "fits": cell.fits,
                "time_scale": args.time_scale if cell.scaled else 1.0,
            }
            result["matrix_command"] = command
            store.record(name, info, router, seed, result)
            print(
                f"    {result['status']} in {result['elapsed_s']} s: hit {result.get('hit_rate')}, "
                f"TTFT mean {result.get('ttft_mean')}, per engine {result.get('engine_requests')}"
                + (f" — {result.get('error')}" if result.get("error") else ""),
                file=sys.stderr,
                flush=True,
            )
    path = summarize(store, args.results)
    print(f"report: {path}")
    return 0


def summarize(store: CellStore, results: Path) -> Path:
    grid = all_cells()
    order = {c.name: i for i, c in enumerate(grid)}
    # whether a cell fits is the grid's definition now, not what it was when the cell ran
    fits = {c.name: c.fits for c in grid}
    cells = sorted(
        ({**c, "fits": fits.get(c["cell"], c.get("fits", False))} for c in store.all()),
        key=lambda c: order.get(c["cell"], len(order)),
    )
    commits = sorted({r["commit"] for c in cells for r in c["runs"].values() if r.get("commit")})
    header = (
        f"{len(cells)} cells with results, {sum(len(c['runs']) for c in cells)} runs "
        f"(commits measured: {', '.join(commits) or 'not recorded'}); "
        f"{ENGINES} simulated engines per run, each run on a fresh fleet. The grid and why: "
        f"`benchmarks/matrix/grid.py`; per-cell figures: `{results.as_posix()}/*.json`."
    )
    made_by = sorted(
        {r["matrix_command"] for c in cells for r in c["runs"].values() if r.get("matrix_command")}
    )
    if made_by:
        header += "\n\nRuns made by: " + "; ".join(f"`{m}`" for m in made_by)
    results.mkdir(parents=True, exist_ok=True)
    # the report sits beside its cell directory: results/matrix.md for results/matrix/
    body = build(cells, ENGINES, results, header)
    return write_report(results.name, "Routing workload matrix (issue 22)", body, results.parent)


if __name__ == "__main__":
    sys.exit(main())
