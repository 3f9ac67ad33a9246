"""Writing a benchmark report: the figures, plus when, where and how they were measured."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path

from hiveroute.bench.environment import git_commit

REPORTS = Path(__file__).resolve().parent / "results"
ROOT = REPORTS.parent.parent


def commit(root: Path = ROOT) -> str:
    """The commit a report measured (`hiveroute.bench.environment.git_commit`), "?" if unknown."""
    return git_commit(root) or "?"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )


def write_report(name: str, title: str, body: str, directory: Path = REPORTS) -> Path:
    """Write benchmarks/results/NAME.md (or DIRECTORY/NAME.md) with the date, machine and exact
    command."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.md"
    script = Path(sys.argv[0])
    if script.parent.name == "benchmarks":
        head = f"-m benchmarks.{script.stem}"
    elif script.parent.parent.name == "benchmarks":  # a benchmark package, or a module in it
        module = "" if script.name == "__main__.py" else f".{script.stem}"
        head = f"-m benchmarks.{script.parent.name}{module}"
    else:
        head = str(script)
    command = " ".join([Path(sys.executable).name, head, *(shlex.quote(a) for a in sys.argv[1:])])
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    path.write_text(
        f"# {title}\n\n- date: {now}; commit {commit()}\n- machine: {machine()}\n"
        f"- command: `{command}`\n\n{body}\n"
    )
    return path


def publish(name: str, title: str, body: str, figures: object = None) -> Path:
    """`write_report`, then the figures beside it as NAME.json (when given), and the report
    printed with where it went: how a benchmark ends."""
    path = write_report(name, title, body)
    if figures is not None:
        path.with_suffix(".json").write_text(json.dumps(figures, indent=1) + "\n")
    print(path.read_text())
    print(f"report: {path}")
    return path
