"""Child processes of the harness: started with their output in a log file, stopped for sure."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import aiohttp


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the harness dies (Linux), so nothing orphans."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return found


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a process (all its threads) and of its live descendants, from
    /proc: a router's own CPU, workers included, beside the clock its clients measure. None
    where there is no /proc (not Linux) or the process is gone."""
    total = 0.0
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            if current == pid:
                return None
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
        stack += _children(current)
    return total


class ChildProcess:
    """One subprocess in its own process group, its stdout/stderr appended to `log_path`."""

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path, name: str) -> None:
        self.proc = proc
        self.log_path = log_path
        self.name = name

    @classmethod
    async def start(
        cls,
        argv: list[str],
        log_path: Path,
        name: str,
        *,
        env: dict[str, str] | None = None,
        stdout_pipe: bool = False,
    ) -> ChildProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE if stdout_pipe else log,
                stderr=log,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        finally:
            log.close()
        return cls(proc, log_path, name)

    def cpu_seconds(self) -> float | None:
        """CPU the process and its descendants have used so far (`tree_cpu_seconds`)."""
        if self.proc.returncode is not None:
            return None
        return tree_cpu_seconds(self.proc.pid)

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.returncode is not None:
            return
        if self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()


async def wait_http_ok(url: str, child: ChildProcess | None, timeout_s: float, what: str) -> None:
    """Poll `url` until it answers 200; fail early with the log tail if the child exits."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if child is not None and child.proc.returncode is not None:
                raise RuntimeError(
                    f"{what} exited with status {child.proc.returncode}; "
                    f"log {child.log_path}:\n{child.log_tail()}"
                )
            try:
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                    if response.status == 200:
                        return
                    last = f"HTTP {response.status}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                last = type(exc).__name__
            await asyncio.sleep(0.2)
    tail = child.log_tail() if child is not None else ""
    raise RuntimeError(f"{what} not ready at {url} after {timeout_s:g}s ({last})\n{tail}")
