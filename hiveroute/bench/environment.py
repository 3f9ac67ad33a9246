"""The machine and software a run happened on, recorded with every report."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


SOURCE_ROOT = Path(__file__).resolve().parents[2]
# A copy made by `git archive` is no checkout: whoever made it names its commit here (the
# matrix's A/B does, for each side it runs)
COMMIT_ENV = "HIVEROUTE_BENCH_COMMIT"


def git_commit(root: Path = SOURCE_ROOT, *, dirty_paths: Sequence[str] = ()) -> str | None:
    """The short commit of the checkout at `root`, with "+dirty" when its tracked files (those
    under `dirty_paths`, when given) have changes; else what COMMIT_ENV says; None when
    neither knows. Every report names the code it measured this one way."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if head.returncode != 0:
            return os.environ.get(COMMIT_ENV) or None
        status = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                *dirty_paths,
            ],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return os.environ.get(COMMIT_ENV) or None
    return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def describe_environment() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "git_commit": git_commit(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("HIVEROUTE_")},
    }
