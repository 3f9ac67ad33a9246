"""`hiveroute serve --workers N`: N router processes on one port, one router to its clients.

The parent reserves the port (bound with SO_REUSEPORT, never listening), serves the shared state
on a Unix socket (hiveroute.state.shared, unless `state` names Redis) and starts N workers. Each
worker is a whole router, assembled by hiveroute.assembly, listening on the port with
SO_REUSEPORT (the kernel spreads connections over them) and subscribing to the engines' KV events
itself. No worker listens before every worker is assembled (each says so on its pipe and waits
for the parent's word): a worker that listened first would take every keep-alive connection
opened meanwhile, and keep them. The workers share what each has in flight on each engine
(requests, prefill backlog) on a load board in shared memory (hiveroute.engines.load_board)
that the parent lays out before they start, so each routes knowing its siblings' load. Each
worker also serves its own /metrics and dashboard overview on a private Unix socket, so
whichever worker answers `/metrics` or `/dashboard/api/overview` merges all of them: the page
shows the whole router, not one worker.
SIGTERM or SIGINT stops the workers; the parent waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import fcntl
import json
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
from aiohttp import web

from hiveroute import runtime
from hiveroute.assembly import Router, assemble
from hiveroute.config import RouterConfig
from hiveroute.engines.load_board import LoadBoard, board_path
from hiveroute.gateway.access_log import configure_logging
from hiveroute.gateway.app import handle_metrics
from hiveroute.gateway.parts import GATEWAY_KEY
from hiveroute.kvindex.prefix_cache import MAX_TOKENS
from hiveroute.kvindex.shared_chunks import SharedChunkStore
from hiveroute.lifecycle import cancel_and_wait
from hiveroute.observability.dashboard import add_dashboard_routes
from hiveroute.observability.merge import merge_metrics, merge_overviews
from hiveroute.runtime import freeze_startup_objects, wait_for_shutdown_signal
from hiveroute.server import SHUTDOWN_GRACE_S, start_router
from hiveroute.state.shared import SharedStateClient, StateServer
from hiveroute.state.store import open_state_store

log = logging.getLogger("hiveroute.workers")

WORKER_HEADER = "X-Hiveroute-Worker"  # the pid of the worker that served a response
STOP_TIMEOUT_S = SHUTDOWN_GRACE_S + 5.0  # a worker's grace for its requests, then its exit
READY_TIMEOUT_S = 120.0
# token ids the workers' shared chunks may hold, all workers together (8 bytes a token): as
# many as one worker's prefix cache
SHARED_CHUNK_TOKENS = MAX_TOKENS
RUN_DIR_PREFIX = "hiveroute-"
ALIVE_LOCK = "alive.lock"  # in a run directory: locked while its router lives
ORPHAN_MIN_AGE_S = 60.0
PARENT_POLL_S = 0.5  # how often a worker checks that its parent is alive (not on Linux)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
# what a worker and its parent say on the worker's pipe, in this order
ASSEMBLED = "assembled"  # worker: my router is built; I listen when you say so
LISTEN = "listen"  # parent: every worker is assembled
READY = "ready"  # worker: I listen on the port


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs from its parent (pickled into the child)."""

    config: RouterConfig
    index: int
    count: int
    run_dir: str
    state_path: str | None  # the parent's state socket; None: `state` is Redis
    parent_pid: int = field(default_factory=os.getpid)  # made in the parent: its pid

    def metrics_socket(self, index: int) -> str:
        return os.path.join(self.run_dir, f"worker-{index}.sock")

    @property
    def board_path(self) -> str:
        """The workers' load board (engines/load_board.py)."""
        return board_path(self.run_dir)

    @property
    def chunks_path(self) -> str:
        """The workers' tokenized chunks (kvindex/shared_chunks.py)."""
        return chunks_path(self.run_dir)


def chunks_path(run_dir: str) -> str:
    """Where a run dir's shared chunks live (a directory, kvindex/shared_chunks.py)."""
    return os.path.join(run_dir, "chunks")


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) with SO_REUSEPORT and not listening: it fixes the port
    (port 0 becomes a real one) for the workers, and the kernel never hands it a connection."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    if port:
        # first without SO_REUSEPORT: a router already listening there (another `serve`, one
        # not yet stopped) would otherwise share the port and split the connections silently
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no user
            try:
                probe.bind(address)
            except OSError as exc:
                raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


async def serve_workers(config: RouterConfig, count: int) -> None:
    """Run `count` workers on config.host:config.port until SIGTERM/SIGINT or a worker dies."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError("workers > 1 needs SO_REUSEPORT (Linux, macOS); set workers: 1")
    if config.state != "memory":  # a bad Redis URL: the config error, here, as with one process
        await open_state_store(config.state).close()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before any worker starts: none is orphaned
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    # in memory when it can be: the load board and the shared chunks are never written to disk
    run_dir, alive = make_run_dir(runtime.memory_dir() or tempfile.gettempdir())
    board = board_path(run_dir)  # removed with the run dir
    reserved = reserve_port(config.host, config.port)
    state: StateServer | None = None
    processes: list[multiprocessing.process.BaseProcess] = []
    pipes: list[Connection] = []  # the parent's end of each worker's pipe, for start-up only
    try:
        config.port = int(reserved.getsockname()[1])
        LoadBoard.create(board, count)
        if config.state == "memory":
            state = StateServer(os.path.join(run_dir, "state.sock"))
            await state.start()
        context = multiprocessing.get_context("spawn")
        for index in range(count):
            spec = WorkerSpec(config, index, count, run_dir, state.path if state else None)
            ours, theirs = context.Pipe(duplex=True)
            process = context.Process(
                target=worker_main, args=(spec, theirs), name=f"hiveroute-worker-{index}"
            )
            process.start()
            theirs.close()
            processes.append(process)
            pipes.append(ours)
        if not await _all_say(ASSEMBLED, pipes, processes, stop):
            return
        for pipe in pipes:
            pipe.send(LISTEN)
        if not await _all_say(READY, pipes, processes, stop):
            return
        for pipe in pipes:
            pipe.close()
        host = "127.0.0.1" if config.host in ("0.0.0.0", "", "::") else config.host
        log.info(
            "hiveroute listening on http://%s:%d with %d workers (policy %s, state %s)",
            host,
            config.port,
            count,
            config.policy,
            "shared in memory" if state else "Redis",
        )
        await _until_stop_or_exit(processes, stop)
    finally:
        for pipe in pipes:  # when a worker failed or a stop came during start-up (closing twice
            pipe.close()  # is harmless)
        await _stop(processes)
        if state is not None:
            await state.stop()
        reserved.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        os.close(alive)


def make_run_dir(base: str) -> tuple[str, int]:
    """A new run directory in `base`, and the open file whose lock says its router lives (held
    until the parent exits, however it exits: the kernel drops the lock with the process).
    Run directories that routers killed outright left behind are removed first."""
    remove_orphaned_run_dirs(base)
    run_dir = tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=base)
    alive = os.open(os.path.join(run_dir, ALIVE_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(alive, fcntl.LOCK_EX)
    return run_dir, alive


def remove_orphaned_run_dirs(base: str, *, min_age_s: float = ORPHAN_MIN_AGE_S) -> list[str]:
    """Remove this user's run directories in `base` whose router is gone: a parent killed
    outright (SIGKILL, the OOM killer) cannot remove its own, and in /dev/shm it holds memory
    until the host restarts. A router is gone when the lock its parent held is free (a lock,
    not a pid: pids are per namespace, and /dev/shm may be shared across containers).
    Directories younger than `min_age_s` are left alone (a router may be making its own).
    Returns the ones removed."""
    removed = []
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            if not entry.name.startswith(RUN_DIR_PREFIX):
                continue
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                if (
                    not stat.S_ISDIR(info.st_mode)
                    or info.st_uid != os.getuid()
                    or now - info.st_mtime < min_age_s
                ):
                    continue
                lock = os.open(os.path.join(entry.path, ALIVE_LOCK), os.O_RDWR)
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its router lives
                finally:
                    os.close(lock)
                shutil.rmtree(entry.path)
                removed.append(entry.path)
    return removed


async def _message(pipe: Connection) -> str:
    """The next word on a pipe, without a thread ("exited" if the other end is gone)."""
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    loop.add_reader(pipe.fileno(), readable.set)
    try:
        await readable.wait()
    finally:
        loop.remove_reader(pipe.fileno())
    try:
        return str(pipe.recv())
    except EOFError:
        return "exited"


async def _all_say(
    word: str, pipes: list[Connection], processes: list[Any], stop: asyncio.Event
) -> bool:
    """True when every worker has said `word`; False when told to stop first; OSError if one
    failed (its message says why) or they took longer than READY_TIMEOUT_S."""
    messages = asyncio.ensure_future(
        asyncio.wait_for(asyncio.gather(*(_message(p) for p in pipes)), READY_TIMEOUT_S)
    )
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({messages, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not messages.done():
        await cancel_and_wait(messages)
        return False
    try:
        found = messages.result()
    except TimeoutError:
        raise OSError(f"the workers did not start in {READY_TIMEOUT_S:.0f} s") from None
    for process, message in zip(processes, found, strict=True):
        if message != word:
            raise OSError(f"worker {process.name} failed: {message}")
    return True


async def _until_stop_or_exit(processes: list[Any], stop: asyncio.Event) -> None:
    """Until SIGTERM or SIGINT; a worker that exits first stops the router with an error
    (OSError: a non-zero exit status), so a supervisor that restarts on failure restarts it
    whole."""
    while not stop.is_set():
        for process in processes:
            if not process.is_alive():
                log.error("worker %s exited (code %s): stopping", process.name, process.exitcode)
                raise OSError(f"worker {process.name} exited (code {process.exitcode})")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


async def _stop(processes: list[Any]) -> None:
    """SIGTERM every worker, wait for them (without a thread), kill what outlives the wait."""
    for process in processes:
        if process.is_alive() and process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
    deadline = asyncio.get_running_loop().time() + STOP_TIMEOUT_S
    while any(p.is_alive() for p in processes) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    for process in processes:
        if process.is_alive():
            log.warning("worker %s did not stop in %.0f s: killed", process.name, STOP_TIMEOUT_S)
            process.kill()
        process.join()


# --- in the worker --------------------------------------------------------------------------


def worker_main(spec: WorkerSpec, parent: Connection) -> None:
    """A worker process: one whole router on the shared port."""
    killed_with_parent = die_with_parent(spec.parent_pid)
    configure_logging(spec.config.log_level)
    try:
        runtime.run(_worker(spec, parent, watch_parent=not killed_with_parent))
    except Exception as exc:  # tell the parent why, once, rather than a silent exit
        with contextlib.suppress(OSError, ValueError):
            parent.send(f"{type(exc).__name__}: {exc}")
        raise SystemExit(1) from None


async def _worker(spec: WorkerSpec, parent: Connection, *, watch_parent: bool) -> None:
    store = SharedStateClient(spec.state_path) if spec.state_path else None
    board = LoadBoard(spec.board_path, spec.index)
    chunks = SharedChunkStore(spec.chunks_path, max_tokens=SHARED_CHUNK_TOKENS // spec.count)
    router = assemble(spec.config, store=store, board=board, shared_chunks=chunks)
    siblings = Siblings(spec)

    async def when_every_worker_is_assembled() -> None:
        parent.send(ASSEMBLED)
        word = await _message(parent)
        if word != LISTEN:
            raise OSError(f"the parent did not say to listen ({word})")

    running = await start_router(
        spec.config,
        router=router,
        reuse_port=True,
        extend=siblings.extend,
        before_listening=when_every_worker_is_assembled,
    )
    private = await _serve_private(router, spec.metrics_socket(spec.index))
    freeze_startup_objects()
    parent.send(READY)
    parent.close()
    try:
        if watch_parent:
            await _first_of(wait_for_shutdown_signal(), _until_orphaned(spec.parent_pid))
        else:
            await wait_for_shutdown_signal()
    finally:
        await private.cleanup()
        await siblings.close()
        await running.stop()
        if board is not None:
            board.close()


def die_with_parent(parent_pid: int) -> bool:
    """A parent killed outright (SIGKILL, the OOM killer) sends its workers nothing: they would
    go on holding the port without the state store it served, beside the workers of the router
    a supervisor restarts. So a crash of the parent is a crash of the router: on Linux the
    kernel kills the worker with it (PR_SET_PDEATHSIG; True); elsewhere (False) the worker
    watches for it (`_until_orphaned`)."""
    armed = False
    libc_name = ctypes.util.find_library("c") if sys.platform == "linux" else None
    if libc_name is not None:
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(libc_name, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    if os.getppid() != parent_pid:  # it died before the request above
        os._exit(1)
    return armed


async def _until_orphaned(parent_pid: int) -> None:
    """Where the kernel cannot kill a worker with its parent (`die_with_parent`): exit, as the
    parent did, once it is gone."""
    while os.getppid() == parent_pid:
        await asyncio.sleep(PARENT_POLL_S)
    log.error("the parent process %d is gone: this worker exits", parent_pid)
    os._exit(1)


async def _first_of(*waits: Coroutine[Any, Any, None]) -> None:
    """Wait for whichever of `waits` ends first; cancel the others."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _serve_private(router: Router, path: str) -> web.AppRunner:
    """This worker's own /metrics and dashboard overview, for its siblings to merge."""
    app = web.Application()
    app[GATEWAY_KEY] = router
    app.router.add_get("/metrics", handle_metrics)
    add_dashboard_routes(app, router.pool, router.metrics, router.policy.name, router.kv_events)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.UnixSite(runner, path).start()
    os.chmod(path, 0o600)
    return runner


class Siblings:
    """The whole router's view from one worker: every worker's metrics, merged."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.pid = str(os.getpid())
        self._sessions: dict[int, aiohttp.ClientSession] = {}

    def extend(self, app: web.Application) -> None:
        """The worker header on every response; /metrics and the overview of all workers."""

        async def header(request: web.Request, response: web.StreamResponse) -> None:
            response.headers[WORKER_HEADER] = self.pid

        app.on_response_prepare.append(header)
        app.middlewares.append(self.middleware)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # innermost: auth and request ids have run, so admin keys apply as to one router
        if request.method == "GET" and request.path == "/metrics":
            texts = await self._gather("/metrics")
            body = merge_metrics([text.decode() for text in texts])
            return web.Response(text=body, content_type="text/plain", charset="utf-8")
        if request.method == "GET" and request.path == "/dashboard/api/overview":
            parts = [json.loads(text) for text in await self._gather("/dashboard/api/overview")]
            return web.json_response(merge_overviews(parts), headers={"Cache-Control": "no-store"})
        response: web.StreamResponse = await handler(request)
        return response

    async def _gather(self, path: str) -> list[bytes]:
        found = await asyncio.gather(
            *(self._fetch(index, path) for index in range(self.spec.count))
        )
        return [text for text in found if text is not None]

    async def _fetch(self, index: int, path: str) -> bytes | None:
        session = self._sessions.get(index)
        if session is None:
            connector = aiohttp.UnixConnector(path=self.spec.metrics_socket(index))
            session = self._sessions[index] = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=5)
            )
        try:
            async with session.get(f"http://worker{path}") as response:
                if response.status == 200:
                    return await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("worker %d did not answer %s: %s", index, path, exc)
        return None

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
