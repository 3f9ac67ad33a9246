"""A real vLLM server for a test session or module (starting one takes ~30 s on the CPU)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def running_vllm(model_dir: Any, log_path: Path, extra_args: Sequence[str] = ()) -> Iterator[Any]:
    from hiveroute.engines.vllm_local import VllmServer

    server = VllmServer(model_dir=model_dir, log_path=log_path, extra_args=list(extra_args))
    server.start()
    try:
        asyncio.run(server.wait_ready())
        yield server
    finally:
        server.stop()
