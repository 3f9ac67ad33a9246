"""A one-line progress bar on stderr (redrawn at most a few times a second; plain lines when
stderr is not a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(
        self, label: str, total: int, *, stream: TextIO | None = None, interval_s: float = 0.2
    ) -> None:
        self.label = label
        self.total = max(1, total)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s if self.tty else 5.0
        self.started = time.monotonic()
        self._last = 0.0
        self._done = 0
        self._errors = 0
        self._in_flight = 0

    def update(self, done: int, errors: int, in_flight: int) -> None:
        self._done, self._errors, self._in_flight = done, errors, in_flight
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self._draw(final=False)

    def render(self) -> str:
        width = 24
        fraction = min(1.0, self._done / self.total)
        filled = int(fraction * width)
        bar = "#" * filled + "-" * (width - filled)
        elapsed = time.monotonic() - self.started
        return (
            f"{self.label:<28.28} [{bar}] {self._done}/{self.total} req"
            f"  {self._in_flight} in flight  {self._errors} err  {elapsed:5.1f}s"
        )

    def _draw(self, final: bool) -> None:
        if self.tty:
            end = "\n" if final else ""
            self.stream.write("\r" + self.render() + "\x1b[K" + end)
        else:
            self.stream.write(self.render() + "\n")
        self.stream.flush()

    def close(self) -> None:
        self._draw(final=True)
