"""`hiveroute serve --workers N`: N processes on one port behave as one router."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hiveroute.bench.workloads.text import filler
from hiveroute.runtime import free_port
from hiveroute.workers import make_run_dir, remove_orphaned_run_dirs
from tests.support.access import metric_sum
from tests.support.fake_engine import FakeEngine

WORKER_HEADER = "X-Hiveroute-Worker"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hiveroute", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize("value", ["0", "-1", "9"])
def test_bad_worker_counts_are_refused_with_a_clear_message(value: str) -> None:
    done = run_cli("serve", "--engine", "http://127.0.0.1:9", "--workers", value)
    assert done.returncode != 0
    assert f"workers must be 1..8 (router processes on this host), got {value}" in (
        done.stdout + done.stderr
    )


def test_the_workers_env_variable_is_checked_as_the_flag() -> None:
    done = run_cli(
        "serve", "--engine", "http://127.0.0.1:9", env={**os.environ, "HIVEROUTE_WORKERS": "0"}
    )
    assert done.returncode != 0 and "workers must be 1..8" in done.stdout + done.stderr


@pytest.fixture
async def two_workers() -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    engine = FakeEngine()
    await engine.start()
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hiveroute", "serve", "--engine", engine.url, "--host", "127.0.0.1",
        "--port", str(port), "--workers", "2", "--log-level", "warning",
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(600):
                try:
                    async with http.get(f"{url}/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
        yield url, proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await engine.stop()


async def _post(url: str, workflow_id: str, agent: str) -> tuple[str, int]:
    """One request on a new connection (the kernel picks a worker per connection)."""
    body = {
        "model": "m",
        "prompt": "p",
        "hiveroute": {"workflow_id": workflow_id, "agent_id": agent},
    }
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.post(f"{url}/v1/completions", json=body) as resp,
    ):
        await resp.read()
        return resp.headers[WORKER_HEADER], resp.status


async def test_two_workers_serve_one_port_share_workflows_and_metrics_and_stop_on_sigterm(
    two_workers: tuple[str, asyncio.subprocess.Process],
) -> None:
    url, proc = two_workers
    served: dict[str, int] = {}
    # Right after the first /health answer: no worker listens before both are assembled, so
    # fresh connections (spread by source port) reach both (all 24 on one: p = 1e-7).
    sent = 24
    for i in range(sent):
        pid, status = await _post(url, "wf-shared", f"agent-{i % 3}")
        assert status == 200
        served[pid] = served.get(pid, 0) + 1
    assert len(served) == 2, f"one worker served all {sent} requests"
    assert str(proc.pid) not in served  # workers serve, the parent does not

    async with aiohttp.ClientSession() as http:
        # /metrics, from whichever worker answers, counts both workers' requests (a request
        # is counted just after its answer is sent: ask until the last one is in)
        counts = []
        for _ in range(50):
            connector = aiohttp.TCPConnector(force_close=True)
            async with (
                aiohttp.ClientSession(connector=connector) as fresh,
                fresh.get(f"{url}/metrics") as resp,
            ):
                counts.append(metric_sum(await resp.text(), "hiveroute_requests_total"))
            if counts[-4:] == [sent] * 4:
                break
            await asyncio.sleep(0.05)
        assert counts[-4:] == [sent] * 4, counts
        # the workflow's record counts every request, whichever worker served it
        async with http.get(f"{url}/v1/workflows/wf-shared") as resp:
            assert resp.status == 200
            workflow = await resp.json()
        async with http.get(f"{url}/dashboard/api/overview") as resp:
            overview = await resp.json()
    assert len(workflow["requests"]) == sent
    assert overview["workers"] == 2  # the workflow GET above is counted too (engine "none")
    assert sum(e["requests"] for e in overview["engines"]) == sent

    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
    for pid in served:  # the workers are gone too
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


async def test_a_context_one_worker_tokenized_is_read_not_tokenized_by_the_other(
    two_workers: tuple[str, asyncio.subprocess.Process],
) -> None:
    """Siblings of one workflow reach both workers: the second reads the context's chunks the
    first tokenized (kvindex/shared_chunks.py), as /metrics counts."""
    url, _ = two_workers
    context = filler(12_000, "a workflow's documents")
    served: set[str] = set()
    for i in range(40):
        body = {
            "model": "m",
            "messages": [
                {"role": "system", "content": "The documents.\n" + context},
                {"role": "user", "content": f"agent {i}: your step"},
            ],
            "max_tokens": 4,
        }
        connector = aiohttp.TCPConnector(force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.post(f"{url}/v1/chat/completions", json=body) as resp,
        ):
            assert resp.status == 200, await resp.text()
            served.add(resp.headers[WORKER_HEADER])
        if len(served) == 2:
            break
    assert len(served) == 2, "one worker served all 40 requests"
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    counts = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("hiveroute_tokenizer_shared_chunks_total{")
    }
    assert counts["published"] > 0 and counts["found"] > 0, counts


async def test_a_worker_that_dies_stops_the_router_with_a_failure(
    two_workers: tuple[str, asyncio.subprocess.Process],
) -> None:
    """A worker killed (out of memory, a crash) stopped the router with exit status 0, so a
    supervisor that restarts on failure (systemd, Docker) left it down."""
    url, proc = two_workers
    pid, status = await _post(url, "wf-crash", "agent-0")
    assert status == 200
    os.kill(int(pid), signal.SIGKILL)
    assert await asyncio.wait_for(proc.wait(), 60) == 1


async def test_the_workers_stop_when_their_parent_is_killed_outright(
    two_workers: tuple[str, asyncio.subprocess.Process],
) -> None:
    url, proc = two_workers
    served: set[str] = set()
    for i in range(24):  # fresh connections reach both workers (all on one: p = 1e-7)
        pid, status = await _post(url, "wf-orphan", f"agent-{i % 3}")
        assert status == 200
        served.add(pid)
    assert len(served) == 2
    proc.kill()  # SIGKILL: the parent cannot pass a SIGTERM on
    await proc.wait()
    port = int(url.rsplit(":", 1)[1])
    alive, listening = set(served), True
    for _ in range(300):  # a bound, not a timing (the kernel frees a dead worker's socket a
        # moment after its process: wait for both)
        alive = {pid for pid in alive if _running(int(pid))}
        # nothing listens on the port (a connection might still meet a TIME_WAIT the killed
        # workers left, so the kernel's table of listeners is what tells)
        listening = _listening(port)
        if not alive and not listening:
            break
        await asyncio.sleep(0.1)
    assert not alive, f"workers {sorted(alive)} outlived their parent"
    assert not listening, f"port {port} still has a listener"


def test_a_run_directory_whose_router_was_killed_is_removed_by_the_next(tmp_path: Path) -> None:
    """A parent killed outright leaves its run directory (in /dev/shm: memory); the next
    router's start removes it, and nothing else: not a living router's, not a new one's."""
    killed = subprocess.Popen(  # a "router" that makes its run directory, then is killed
        [sys.executable, "-c", "import sys, time; from hiveroute.workers import make_run_dir; "
         "print(make_run_dir(sys.argv[1])[0], flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert killed.stdout is not None
    orphan = Path(killed.stdout.readline().strip())
    (orphan / "chunks").mkdir()
    (orphan / "chunks" / "x.chunk").write_bytes(b"12345678")
    living, alive = make_run_dir(str(tmp_path))
    unrelated = tmp_path / "something-else"
    unrelated.mkdir()
    # while it lives its directory is kept, however old
    assert remove_orphaned_run_dirs(str(tmp_path), min_age_s=0) == []
    killed.kill()
    killed.wait()
    assert remove_orphaned_run_dirs(str(tmp_path)) == []  # too young to be sure
    assert remove_orphaned_run_dirs(str(tmp_path), min_age_s=0) == [str(orphan)]
    assert not orphan.exists()
    assert Path(living).exists() and unrelated.exists()
    os.close(alive)


def test_where_the_kernel_cannot_kill_a_worker_with_its_parent_it_exits_when_orphaned() -> None:
    # the fallback of platforms without PR_SET_PDEATHSIG: its parent (pid -1) is already gone
    code = "import asyncio; from hiveroute.workers import _until_orphaned as u; asyncio.run(u(-1))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "is gone: this worker exits" in done.stderr


def _listening(port: int) -> bool:
    """Whether a TCP socket of this host listens on `port` (/proc/net/tcp: state 0A)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, exited but not reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _overview(url: str) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.get(f"{url}/dashboard/api/overview") as resp,
    ):
        assert resp.status == 200
        found: dict[str, Any] = await resp.json()
        return found


async def test_each_worker_counts_the_requests_its_siblings_hold_in_flight() -> None:
    """A stream held open on one worker is in the other's queue depth (the load board): the
    overview's per-engine queue depth is the first worker's view, its in-flight count the
    sum of every worker's own."""
    engine = FakeEngine()
    engine.behaviour.hold_after_chunk = 0  # every stream waits after its first chunk
    await engine.start()
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hiveroute", "serve", "--engine", engine.url, "--host", "127.0.0.1",
        "--port", str(port), "--workers", "2", "--policy", "least_load",
        "--log-level", "warning", stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    held: list[tuple[aiohttp.ClientSession, aiohttp.ClientResponse]] = []
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(600):
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{url}/health") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.1)
        holders: dict[str, int] = {}
        body = {"model": "m", "prompt": "p", "stream": True}
        while len(holders) < 2:  # a stream held on each worker
            assert len(held) < 60, f"one worker took every connection: {holders}"
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
            resp = await session.post(f"{url}/v1/completions", json=body)
            held.append((session, resp))
            assert resp.status == 200
            await resp.content.readline()  # its first chunk: routed, counted, held
            pid = resp.headers[WORKER_HEADER]
            holders[pid] = holders.get(pid, 0) + 1
        overview = await _overview(url)
        [seen] = overview["engines"]
        assert seen["in_flight"] == len(held)  # each worker's own, summed
        assert seen["queue_depth"] == len(held)  # one worker's view: its siblings' too
        engine.release.set()
        for session, resp in held:
            await resp.read()
            resp.release()
            await session.close()
        held.clear()
        for _ in range(100):  # each worker uncounts a request just after its last byte
            [seen] = (await _overview(url))["engines"]
            if seen["queue_depth"] == seen["in_flight"] == 0:
                break
            await asyncio.sleep(0.05)
        assert seen["queue_depth"] == seen["in_flight"] == 0
    finally:
        engine.release.set()
        for session, resp in held:
            resp.release()
            await session.close()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await engine.stop()


async def test_a_router_takes_no_connection_until_before_listening_returns() -> None:
    """What keeps a worker off the port until its siblings are assembled (else the first to
    listen takes every keep-alive connection opened meanwhile, and keeps them)."""
    from hiveroute.config import RouterConfig
    from hiveroute.server import start_router

    port = free_port()
    refused: list[bool] = []

    async def before_listening() -> None:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            refused.append(False)
        except OSError:
            refused.append(True)

    config = RouterConfig(engine=["http://127.0.0.1:9"], host="127.0.0.1", port=port).validate()
    running = await start_router(config, before_listening=before_listening)
    try:
        assert refused == [True]
        _, writer = await asyncio.open_connection("127.0.0.1", port)  # now it listens
        writer.close()
    finally:
        await running.stop()


async def test_a_failure_before_listening_leaves_the_port_free() -> None:
    from hiveroute.config import RouterConfig
    from hiveroute.server import start_router

    port = free_port()

    async def parent_gone() -> None:
        raise OSError("the parent did not say to listen (exited)")

    config = RouterConfig(engine=["http://127.0.0.1:9"], host="127.0.0.1", port=port).validate()
    with pytest.raises(OSError, match="did not say to listen"):
        await start_router(config, before_listening=parent_gone)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


def test_a_port_another_router_listens_on_is_refused() -> None:
    """Bound with SO_REUSEPORT alone, a second `serve --workers` on a port the first still
    listened on started without a word and split the connections with it."""
    from hiveroute.workers import reserve_port

    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as a running router's
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            reserve_port("127.0.0.1", port)
    reserve_port("127.0.0.1", port).close()  # free again
