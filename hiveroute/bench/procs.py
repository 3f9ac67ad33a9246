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
