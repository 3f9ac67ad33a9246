"""N simulated engines in one process: each with its HTTP port and KV-event sockets."""

from __future__ import annotations

import contextlib
import gc
import logging

from aiohttp import web

from hiveroute.kvindex.tokenizer import Tokenizer, load_tokenizer
from hiveroute.sim.config import SimConfig
from hiveroute.sim.deadlines import DeadlineBoard
from hiveroute.sim.engine import SimEngine
from hiveroute.sim.server import build_engine_app

log = logging.getLogger("hiveroute.sim")

# Passes of the cyclic garbage collector's middle generation per pass of its youngest (Python's
# default is 10). See `settle_collector`.
YOUNG_PASSES_PER_OLDER = 1000


def settle_collector() -> None:
    """Keep the garbage collector's long passes out of the engines' steps, for a process that
    runs simulated engines and little else (`hiveroute sim`, the step-lag benchmark).

    The block pools are hundreds of thousands of objects that live as long as the process:
    frozen, no pass walks them again. The requests in flight are tens of thousands more; a
    pass over them takes 5-20 ms, two steps' worth, and with Python's thresholds one runs every
    second. Requests free themselves without the collector (nothing of theirs forms a cycle),
    so the older passes can be rare: about one a minute under load.
    """
    gc.freeze()
    young, _, oldest = gc.get_threshold()
    gc.set_threshold(young, YOUNG_PASSES_PER_OLDER, oldest)


class SimFleet:
    """Start, address and stop a set of simulated engines.

    Ports: engine i listens on base_port + i, publishes KV events on events_base_port + i and
    answers replay on replay_base_port + i (default events_base_port + 100 + i); a base of 0
    lets each engine pick free ports. Read the real addresses from `engines[i]` after start().
    """

    def __init__(self, config: SimConfig, *, tokenizer: Tokenizer | None = None) -> None:
        self.config = config.validate()
        self.tokenizer = tokenizer or load_tokenizer(config.tokenizer)
        self.engines: list[SimEngine] = []
        self.board = DeadlineBoard()  # the engines share one event loop, and so their step ends
        self._runners: list[web.AppRunner] = []

    async def start(self) -> None:
        try:
            for i in range(self.config.engines):
                await self._start_engine(i)
        except BaseException:
            await self.stop()
            raise

    async def _start_engine(self, i: int) -> None:
        config = self.config
        engine = SimEngine(config, i, self.tokenizer, self.board)
        self.engines.append(engine)
        events_port = config.events_base_port + i if config.events_base_port else 0
        await engine.start_events(events_port, config.replay_port(i))
        runner = web.AppRunner(build_engine_app(engine), handler_cancellation=True, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        port = config.base_port + i if config.base_port else 0
        site = web.TCPSite(runner, config.host, port, backlog=4096, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise OSError(f"cannot listen on {config.host}:{port}: {exc.strerror}") from None
        bound = next(iter(runner.addresses))[1]
        host = "127.0.0.1" if config.host in ("0.0.0.0", "") else config.host
        engine.url = f"http://{host}:{bound}"
        engine.start_loop()
        log.info(
            "sim engine %d: %s events=%s replay=%s (%d blocks of %d)",
            i, engine.url, engine.events_endpoint, engine.replay_endpoint,
            engine.pool.num_blocks, engine.block_size,
        )  # fmt: skip

    def engine_spec_texts(self) -> list[str]:
        """Each engine as `hiveroute serve --engine` takes it."""
        texts = []
        for engine in self.engines:
            parts = [engine.url]
            if engine.events_endpoint:
                parts.append(f"events={engine.events_endpoint}")
            if engine.replay_endpoint:
                parts.append(f"replay={engine.replay_endpoint}")
            texts.append(",".join(parts))
        return texts

    async def stop(self) -> None:
        for runner in self._runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()
        self._runners.clear()
        for engine in self.engines:
            await engine.stop()
        self.engines.clear()

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
