"""The pool of engines: membership, health checks and load scraping.

The pool owns every Engine's mutable state. Health checks run in one background task; requests
that fail report back through `report_failure`, so a dead engine leaves rotation at once rather
than at the next check, and the checker puts it back when it answers again.

Under `serve --workers N` one worker checks each engine (its prober, load_board.py) and the
others read what it found from the board, a quarter of a round at a time: a check is three
requests to the engine and a parse of its /metrics, and N workers asking each engine the same
questions cost the engines and the router N times what one answer does. A worker checks an
engine itself when the board has no room for it, or when the prober's latest round is more than
`QUIET_ROUNDS` rounds old.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp

from hiveroute.engines.client import EngineClient
from hiveroute.engines.engine import Engine, EngineLoad, EngineSpec, SharedEngineLoad
from hiveroute.engines.load_board import EngineCell, HealthReport, LoadBoard, models_hash
from hiveroute.engines.prom_text import info_labels, parse_prometheus_text
from hiveroute.lifecycle import cancel_and_wait

log = logging.getLogger("hiveroute.engines")

EngineListener = Callable[[Engine], None]

FOLLOW_READS = 4  # board reads per health round by the workers that do not probe an engine
QUIET_ROUNDS = 3  # a prober silent for this many rounds (and a check's timeout) is not waited for


class EnginePool:
    def __init__(
        self,
        specs: Iterable[EngineSpec] = (),
        *,
        client: EngineClient | None = None,
        health_interval_s: float = 2.0,
        failures_to_down: int = 2,
        board: LoadBoard | None = None,
    ) -> None:
        self._engines: dict[str, Engine] = {}
        self.health_interval_s = health_interval_s
        self.failures_to_down = failures_to_down
        self._on_added: list[EngineListener] = []
        self._on_removed: list[EngineListener] = []
        self._task: asyncio.Task[None] | None = None
        self.panic_routings = 0  # times routing fell back to slow engines as none was healthy
        # Health checks go through the router's EngineClient (the engine's key and timeouts);
        # a pool built without one (policy tests) never checks.
        self.client = client
        # Under `serve --workers`: the host's load board, where this worker counts its requests
        # in flight on each engine and reads its siblings' (None: this process is the router).
        self.board = board
        self._followed: dict[str, float] = {}  # engine -> the prober's round last taken from
        self._down_by_prober: set[str] = set()  # engines out because the prober's round said so
        for spec in specs:
            self.add(spec)

    # membership -----------------------------------------------------------------------------

    @property
    def engines(self) -> list[Engine]:
        return list(self._engines.values())

    def get(self, name: str) -> Engine | None:
        return self._engines.get(name)

    def add(self, spec: EngineSpec) -> Engine:
        """Add an engine (idempotent by name); listeners hear of new ones."""
        existing = self._engines.get(spec.name)
        if existing is not None and existing.spec == spec:
            return existing
        if existing is not None and self.board is not None:
            self.board.leave(spec.name)  # the old one's late requests must not count on the new
        engine = Engine(spec=spec, load=self._new_load(spec.name))
        self._engines[spec.name] = engine
        self._followed.pop(spec.name, None)
        self._down_by_prober.discard(spec.name)
        for listener in self._on_added:
            listener(engine)
        return engine

    def _new_load(self, name: str) -> EngineLoad:
        """A fresh engine's load: on the board when there is one (and room on it)."""
        cell = self.board.join(name) if self.board is not None else None
        return EngineLoad() if cell is None else SharedEngineLoad(cell)

    def remove(self, name: str) -> None:
        engine = self._engines.pop(name, None)
        self._followed.pop(name, None)
        self._down_by_prober.discard(name)
        if engine is not None:
            if self.board is not None:  # its counts must not linger on the siblings' view
                self.board.leave(name)
            for listener in self._on_removed:
                listener(engine)

    def on_added(self, listener: EngineListener) -> None:
        self._on_added.append(listener)

    def on_removed(self, listener: EngineListener) -> None:
        self._on_removed.append(listener)

    # selection ------------------------------------------------------------------------------

    def candidates(self, model: str | None) -> list[Engine]:
        """Healthy engines that serve `model`.

        When none is healthy but some were taken out only for being slow (timeouts, not refused
        connections), those are returned instead: under overload every engine answers its
        health check late, and refusing all traffic then would turn a slowdown into an outage.
        Engines that cannot be reached at all stay out, so a dead fleet still gets a quick 503.
        """
        serving = [e for e in self._engines.values() if e.serves(model)]
        healthy = [e for e in serving if e.healthy]
        if healthy:
            return healthy
        slow = [e for e in serving if e.down_but_reachable]
        if slow:
            self.panic_routings += 1
        return slow

    def known_models(self) -> set[str]:
        models: set[str] = set()
        for engine in self._engines.values():
            models |= engine.models
        return models

    def any_serves(self, model: str) -> bool:
        """Whether some engine (healthy or not) lists `model`, or no engine has listed any yet."""
        if not any(e.models for e in self._engines.values()):
            return True
        return any(model in e.models for e in self._engines.values())

    # health ---------------------------------------------------------------------------------

    def report_failure(self, engine: Engine, reason: str, *, slow: bool = False) -> None:
        """A request failed on the engine: take it out now; the checker brings it back.

        `slow`: the engine was reached but did not answer in time.
        """
        engine.consecutive_failures += 1
        if engine.healthy:
            log.warning("engine %s taken out: %s", engine.name, reason)
        engine.mark_down(reason, slow=slow)

    def report_success(self, engine: Engine) -> None:
        engine.consecutive_failures = 0

    async def start(self) -> None:
        """Check every engine once (so the first request sees real health), then keep checking."""
        await self.check_all()
        self._task = asyncio.create_task(self._loop(), name="engine-health")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _loop(self) -> None:
        reads = FOLLOW_READS if self.board is not None else 1
        tick = 0
        while True:
            await asyncio.sleep(self.health_interval_s / reads)
            tick += 1
            try:
                if tick % reads == 0:
                    await self.health_round()
                else:
                    await self.follow_board()
            except Exception:  # a bug in one round must not end health checking
                log.exception("health check round failed")

    async def check_all(self) -> None:
        """Check every engine now, this worker itself (at start: before the probers' first
        rounds are on the board)."""
        await asyncio.gather(*(self.check(e) for e in list(self._engines.values())))

    async def health_round(self) -> None:
        """Check the engines this worker probes, and those whose prober has gone quiet; take
        the others' health from the board."""
        now = time.monotonic()
        quiet_after = QUIET_ROUNDS * self.health_interval_s
        if self.client is not None:
            quiet_after += self.client.timeouts.health_s
        own: list[Engine] = []
        followed: list[tuple[Engine, HealthReport]] = []
        for engine in list(self._engines.values()):
            report = self._probers_round(engine)
            if report is None or now - report.checked_at > quiet_after:
                own.append(engine)
            else:
                followed.append((engine, report))
        await asyncio.gather(
            *(self.check(e) for e in own), *(self._follow(e, r) for e, r in followed)
        )

    async def follow_board(self) -> None:
        """Take the probers' rounds that are new since the last read (between this worker's
        own rounds, so a change reaches it within a quarter of a round)."""
        followed = []
        for engine in list(self._engines.values()):
            report = self._probers_round(engine)
            if report is not None:
                followed.append(self._follow(engine, report))
        await asyncio.gather(*followed)

    def _cell(self, engine: Engine) -> EngineCell | None:
        return self.board.cell(engine.name) if self.board is not None else None

    def _probers_round(self, engine: Engine) -> HealthReport | None:
        """The latest round another worker, the engine's prober, put on the board (None: this
        worker probes the engine, the board has no cell for it, or no round is there yet)."""
        cell = self._cell(engine)
        return None if cell is None or cell.probes() else cell.read_health()

    async def _follow(self, engine: Engine, report: HealthReport) -> None:
        """Take the prober's round: the engine's load, and its health, except that an engine
        this worker took out after that round stays out until a later one."""
        if report.checked_at <= self._followed.get(engine.name, 0.0):
            return
        self._followed[engine.name] = report.checked_at
        load = engine.load
        load.running, load.waiting, load.kv_usage = report.running, report.waiting, report.kv_usage
        load.scraped_at = report.scraped_at
        load.in_flight_at_scrape = report.in_flight_at_scrape
        if report.kv_capacity_blocks is not None:
            engine.kv_capacity_blocks = report.kv_capacity_blocks
        if report.block_size is not None and engine.block_size is None:
            engine.block_size = report.block_size
        if report.healthy:
            if engine.healthy:
                engine.consecutive_failures = 0
            elif engine.down_since is None or engine.down_since < report.checked_at:
                if engine.name not in self._down_by_prober:  # the prober logs its own
                    log.info("engine %s is back", engine.name)
                self._down_by_prober.discard(engine.name)
                engine.mark_up()
        else:  # the prober logged it
            if engine.healthy:
                self._down_by_prober.add(engine.name)
            engine.mark_down(report.reason or "its health check failed", slow=report.reachable)
        if report.models_hash != models_hash(engine.models) and self.client is not None:
            try:  # rare: models change when an engine restarts or loads an adapter
                models = await self.client.list_models(engine)
            except (TimeoutError, aiohttp.ClientError, ValueError, KeyError):
                return  # the prober's next round says whether the engine is still up
            if models is not None:
                engine.models = models

    def _publish(self, engine: Engine) -> None:
        """A round this worker made as the engine's prober, for the other workers."""
        cell = self._cell(engine)
        if cell is None or not cell.probes():
            return
        load = engine.load
        cell.publish_health(
            HealthReport(
                checked_at=time.monotonic(),
                healthy=engine.healthy,
                reachable=engine.down_but_reachable,
                reason=engine.last_error,
                running=load.running,
                waiting=load.waiting,
                kv_usage=load.kv_usage,
                scraped_at=load.scraped_at,
                in_flight_at_scrape=load.in_flight_at_scrape,
                kv_capacity_blocks=engine.kv_capacity_blocks,
                block_size=engine.block_size,
                models_hash=models_hash(engine.models),
            )
        )

    async def check(self, engine: Engine) -> None:
        """One health round for one engine (published for the other workers when this one
        probes it)."""
        try:
            await self._check(engine)
        finally:
            if engine.healthy:
                self._down_by_prober.discard(engine.name)
            self._publish(engine)

    async def _check(self, engine: Engine) -> None:
        """One health round for one engine: /health, then /v1/models and /metrics if it is up."""
        client = self.client
        assert client is not None, "an EnginePool without an EngineClient cannot check engines"
        try:
            await client.check_health(engine)
            models = await client.list_models(engine)
            if models is not None:
                engine.models = models
            text = await client.scrape_metrics(engine)
            if text is not None:
                self._apply_metrics(engine, text)
        except (TimeoutError, aiohttp.ClientError, RuntimeError, ValueError, KeyError) as exc:
            reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
            # late, not gone: a timeout, unless it was connecting that timed out
            slow = isinstance(exc, TimeoutError) and not isinstance(
                exc, aiohttp.ConnectionTimeoutError
            )
            engine.consecutive_failures += 1
            if engine.healthy and engine.consecutive_failures >= self.failures_to_down:
                log.warning("engine %s is down: %s", engine.name, reason)
                engine.mark_down(reason, slow=slow)
            elif not engine.healthy:
                engine.down_but_reachable = slow
            return
        if not engine.healthy:
            log.info("engine %s is back", engine.name)
        engine.mark_up()

    @staticmethod
    def _apply_metrics(engine: Engine, text: str) -> None:
        values = parse_prometheus_text(text)
        load = engine.load
        load.running = values.get("vllm:num_requests_running", load.running)
        load.waiting = values.get("vllm:num_requests_waiting", load.waiting)
        usage = values.get("vllm:kv_cache_usage_perc", values.get("vllm:gpu_cache_usage_perc"))
        if usage is not None:
            load.kv_usage = usage
        load.scraped_at = time.monotonic()
        load.in_flight_at_scrape = load.router_in_flight  # every worker's: none is foreign
        cache = info_labels(text, "vllm:cache_config_info")
        if cache is not None:
            blocks, size = cache.get("num_gpu_blocks", ""), cache.get("block_size", "")
            if blocks.isdigit() and int(blocks) > 0:
                engine.kv_capacity_blocks = int(blocks)
            if size.isdigit() and int(size) > 0 and engine.block_size is None:
                engine.block_size = int(size)
