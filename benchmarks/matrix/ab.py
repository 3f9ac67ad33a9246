"""Two commits of the router on the same matrix cells, run by turns: the judge of a change.

    PYTHONPATH=. python -m benchmarks.matrix.ab --base main --candidate HEAD \
        --cells ag-f8-c4k-g0.2-role,ag-f8-c32k-g0.2-context --seeds 0,1,2 --name my_change_ab

Why by turns: this machine's speed drifts over hours (its 2 cores are shared). On 2026-12-06
main's `hiveroute:workflow` took 86.7, 89.6 and 85.1 ms of TTFT mean in the three seeds of
ag-f8-c32k-g0.2-context at 13:35 UTC, against 77.4, 83.3 and 78.0 ms for the same router code
at 08:40, the engines' own TTFT within 2 ms of each other (fleet_home_experiment.md): runs of
a change set against runs stored hours before judge the machine as much as the change. Here
every (cell, seed) runs on both commits back to back, which one goes first alternating, and
`compare` judges the two result sets by the matrix's tie rule.

Each commit is exported with `git archive` to OUT/LABEL/tree (neither run sees the other's
files, and the work tree may have changes), and reads the Mooncake trace this checkout finds
(`full_trace_path`); its runs go to OUT/LABEL/results (one JSON per cell, as the matrix keeps
them, each run naming its commit) and OUT/LABEL/runs. A run already there (and ok) is not
run again, so an interrupted comparison resumes. Writes benchmarks/results/NAME.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.cli import comma_ints, comma_list
from benchmarks.matrix.compare import report
from benchmarks.matrix.grid import all_cells, select
from benchmarks.matrix.store import CellStore
from benchmarks.report import ROOT, publish
from hiveroute.bench.environment import COMMIT_ENV
from hiveroute.bench.workloads.trace import full_trace_path


@dataclass(frozen=True)
class Side:
    """One commit under comparison: its label, its commit and where its runs go."""

    label: str
    commit: str
    home: Path

    @property
    def tree(self) -> Path:
        return self.home / "tree"

    @property
    def results(self) -> Path:
        return self.home / "results"


def turns(cells: list[str], seeds: list[int]) -> list[tuple[str, int, bool]]:
    """(cell, seed, base first?) in the order to run them: seed by seed, cell by cell, the side
    that goes first alternating, so neither commit always runs on a machine the other just
    warmed (or left busy)."""
    pairs = [(cell, seed) for seed in seeds for cell in cells]
    return [(cell, seed, i % 2 == 0) for i, (cell, seed) in enumerate(pairs)]


def export(ref: str, label: str, out: Path) -> Side:
    """`ref`'s tree, exported to OUT/LABEL/tree (replacing an older export of it)."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", ref],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    side = Side(label, commit, out / label)
    shutil.rmtree(side.tree, ignore_errors=True)
    side.tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(side.tree)], input=archive, check=True)
    return side


def run_matrix(side: Side, cell: str, router: str, seed: int, refs: bool) -> int:
    """One matrix run of `side`'s tree (both sides on one trace file); its exit status."""
    argv = [
        sys.executable,
        "-m",
        "benchmarks.matrix",
        "--cells",
        cell,
        "--routers",
        router,
        "--seeds",
        str(seed),
        "--no-ideal",
        "--router-log-level",
        "info",
        "--results",
        str(side.results),
        "--out",
        str(side.home / "runs"),
    ]
    if not refs:
        argv.append("--no-refs")
    env = {
        **os.environ,
        "PYTHONPATH": str(side.tree),
        COMMIT_ENV: side.commit,
        "HIVEROUTE_TRACE": str(full_trace_path()),
    }
    return subprocess.run(argv, cwd=side.tree, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.matrix.ab", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--base", default="main", help="the reference commit (default main)")
    parser.add_argument("--candidate", default="HEAD", help="the changed commit (default HEAD)")
    parser.add_argument("--cells", type=comma_list, required=True, help="comma-separated (NAME*)")
    parser.add_argument("--seeds", type=comma_ints, default=[0, 1, 2])
    parser.add_argument("--router", default="hiveroute:workflow")
    parser.add_argument(
        "--refs", action="store_true", help="also run +refs in role-first cells (each side)"
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/hiveroute-ab"))
    parser.add_argument("--name", default="matrix_ab", help="report: benchmarks/results/NAME.md")
    args = parser.parse_args(argv)
    try:
        cells = [c.name for c in select(all_cells(), args.cells)]
    except ValueError as exc:  # a name that is no cell: say which
        parser.error(str(exc))
    try:
        base = export(args.base, "base", args.out)
        candidate = export(args.candidate, "candidate", args.out)
    except subprocess.CalledProcessError as exc:
        parser.error(f"cannot export {exc.cmd[-1]} with git archive: is it a commit here?")
    routers = [args.router] + ([args.router + "+refs"] if args.refs else [])
    failed = 0
    for cell, seed, base_first in turns(cells, args.seeds):
        for side in (base, candidate) if base_first else (candidate, base):
            if all(CellStore(side.results).done(cell, r, seed) for r in routers):
                continue
            print(f"{cell} seed {seed}: {side.label} ({side.commit})", flush=True)
            failed += run_matrix(side, cell, args.router, seed, args.refs) != 0
    body = report(
        args.router,
        base.results,
        candidate.results,
        f"{args.base} ({base.commit})",
        f"{args.candidate} ({candidate.commit})",
    )
    publish(args.name, f"{args.base} against {args.candidate}, run by turns", body)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
