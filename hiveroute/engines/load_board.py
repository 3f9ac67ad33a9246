"""The load board: what every worker of one host has in flight on each engine, in shared memory.

Under `serve --workers N` each worker is a whole router that counts only its own requests; the
engines' /metrics show the siblings' ones seconds later. A call to the parent per request costs
more CPU than the routing it would improve, so the workers publish their counts on a board: a
file in their run dir, mapped by every worker, with one row per worker and one cell per engine
in each row (requests in flight, prefill backlog tokens and requests, when that backlog began,
live blocks and when they were counted).
A worker writes only its own row, so a cell has one writer and needs no lock; a reader may see
a sibling's number a moment old, or a row half updated, which routing tolerates as it tolerates
a scrape seconds old.

Engines come and go at run time (DNS, Kubernetes), so which cell is whose engine is itself on
the board: a table of 64-bit name hashes, open addressing, changed only under a file lock (once
per engine per worker). A slot records which workers hold it and is freed when the last one
lets the engine go, so churn does not fill the table; when it is full all the same, the engine
is counted locally only (a warning, once). It lives under `engines` because both the pool and
the prefill backlog (routing) read it.

Health is a fact about the engine, not about a worker, so one worker per engine checks it: the
engine's prober, the lowest-numbered worker holding its slot (so a worker that lets the engine
go hands the checks on). The prober writes what each round found in the slot's health record,
and the others read it there instead of asking the engine again: N workers cost an engine one
worker's health checks, not N (see pool.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

log = logging.getLogger("hiveroute.engines")

MAX_WORKERS = 8  # `serve --workers` allows 1..8; a slot's holders are bits of one word
DEFAULT_SLOTS = 1024
_MAGIC = b"HRBOARD2"
_HEADER = struct.Struct("<8sQQ")  # magic, workers, slots
_HEADER_BYTES = 64
_EMPTY, _FREED = 0, 1  # hash values that mark a slot never used / given back
# a cell's fields, each a float64 (counts are exact to 2**53)
IN_FLIGHT, BACKLOG_TOKENS, BACKLOG_REQUESTS, BACKLOG_SINCE, LIVE_BLOCKS, LIVE_AT = range(6)
FIELDS = 6
# the health record of a slot (one writer: the engine's prober), each a float64
(
    CHECKED_AT,
    HEALTHY,
    REACHABLE,
    RUNNING,
    WAITING,
    KV_USAGE,
    SCRAPED_AT,
    IN_FLIGHT_AT_SCRAPE,
    KV_CAPACITY,
    BLOCK_SIZE,
    MODELS_HASH,
    REASON_LENGTH,
) = range(12)
HEALTH_FIELDS = 12
REASON_BYTES = 256  # why the engine is down, as the prober's check found it (UTF-8, cut short)

FloatArray = npt.NDArray[np.float64]


def name_hash(name: str) -> int:
    """An engine name's 64-bit key in the slot table (never one of the two markers)."""
    value = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return value if value > _FREED else value + 2


def models_hash(models: set[str]) -> int:
    """A set of model ids as a number a float64 holds exactly (53 bits); 0: none listed."""
    if not models:
        return 0
    digest = hashlib.blake2b("\n".join(sorted(models)).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) or 1


@dataclass(frozen=True)
class _Layout:
    hashes: int
    holders: int
    cells: int
    health: int
    reasons: int
    size: int


def _layout(workers: int, slots: int) -> _Layout:
    """Offsets of the hashes, the holders, the cells, the health records and their reasons,
    and the file's size."""
    hashes = _HEADER_BYTES
    holders = hashes + 8 * slots
    cells = holders + 8 * slots
    health = cells + 8 * workers * slots * FIELDS
    reasons = health + 8 * slots * HEALTH_FIELDS
    return _Layout(hashes, holders, cells, health, reasons, reasons + slots * REASON_BYTES)


@dataclass(frozen=True)
class HealthReport:
    """What the prober's latest check of an engine found (`checked_at`: time.monotonic() at
    its end, which every process of a host reads alike)."""

    checked_at: float
    healthy: bool
    reachable: bool  # down, but it answered late rather than not at all
    reason: str | None
    running: float
    waiting: float
    kv_usage: float
    scraped_at: float
    in_flight_at_scrape: int
    kv_capacity_blocks: int | None
    block_size: int | None
    models_hash: int


class EngineCell:
    """One engine's cells on the board, as one worker sees them: `mine` (this worker's, to
    write) is a row of `column` (every worker's, to read). Both are numpy views of the shared
    memory until the worker lets the engine go; then they point at private zeros, so a late
    write from a request still on that engine reaches no one."""

    __slots__ = ("column", "health", "holders", "in_flight_column", "index", "mine", "reason")

    def __init__(
        self,
        column: FloatArray,
        index: int,
        health: FloatArray,
        holders: npt.NDArray[np.uint64],
        reason: memoryview,
    ) -> None:
        self.index = index  # this worker's row in `column`
        self._point(column, health, holders, reason)

    def _point(
        self,
        column: FloatArray,
        health: FloatArray,
        holders: npt.NDArray[np.uint64],
        reason: memoryview,
    ) -> None:
        self.column = column
        self.mine = column[self.index]
        self.in_flight_column = column[:, IN_FLIGHT]  # every worker's requests in flight
        self.health = health  # the slot's health record
        self.holders = holders  # one word: a bit per worker holding the slot
        self.reason = reason

    def detach(self) -> None:
        mine = np.array([1 << self.index], dtype=np.uint64)
        self._point(
            np.zeros_like(self.column),
            np.zeros_like(self.health),
            mine,
            memoryview(bytearray(REASON_BYTES)),
        )

    def probes(self) -> bool:
        """Whether this worker checks the engine's health for every worker: it is the
        lowest-numbered one holding the slot."""
        held = int(self.holders[0])
        return held & -held == 1 << self.index

    def publish_health(self, report: HealthReport) -> None:
        """The prober's round, for the others (the time last: a reader that sees it new sees
        the rest of this round, or a newer one)."""
        health = self.health
        health[HEALTHY] = report.healthy
        health[REACHABLE] = report.reachable
        health[RUNNING] = report.running
        health[WAITING] = report.waiting
        health[KV_USAGE] = report.kv_usage
        health[SCRAPED_AT] = report.scraped_at
        health[IN_FLIGHT_AT_SCRAPE] = report.in_flight_at_scrape
        health[KV_CAPACITY] = report.kv_capacity_blocks or 0
        health[BLOCK_SIZE] = report.block_size or 0
        health[MODELS_HASH] = report.models_hash
        reason = (report.reason or "").encode()[:REASON_BYTES]
        if int(health[REASON_LENGTH]) != len(reason) or bytes(self.reason[: len(reason)]) != reason:
            self.reason[: len(reason)] = reason
            health[REASON_LENGTH] = len(reason)
        health[CHECKED_AT] = report.checked_at

    def read_health(self) -> HealthReport | None:
        """The prober's latest round (None: none yet). A round written meanwhile may show
        through in part, which the next read corrects, as for the load counts."""
        row = self.health.tolist()
        if row[CHECKED_AT] <= 0:
            return None
        length = min(int(row[REASON_LENGTH]), REASON_BYTES)
        reason = bytes(self.reason[:length]).decode(errors="replace") or None
        return HealthReport(
            checked_at=row[CHECKED_AT],
            healthy=bool(row[HEALTHY]),
            reachable=bool(row[REACHABLE]),
            reason=reason,
            running=row[RUNNING],
            waiting=row[WAITING],
            kv_usage=row[KV_USAGE],
            scraped_at=row[SCRAPED_AT],
            in_flight_at_scrape=int(row[IN_FLIGHT_AT_SCRAPE]),
            kv_capacity_blocks=int(row[KV_CAPACITY]) or None,
            block_size=int(row[BLOCK_SIZE]) or None,
            models_hash=int(row[MODELS_HASH]),
        )

    def router_in_flight(self) -> int:
        """Requests every worker has in flight on the engine (a list sum: cheaper than numpy's
        for at most 8 numbers)."""
        return int(sum(self.in_flight_column.tolist()))

    def publish_in_flight(self, requests: int) -> None:
        self.mine[IN_FLIGHT] = requests

    def publish_backlog(self, tokens: int, requests: int, since: float) -> None:
        mine = self.mine
        mine[BACKLOG_TOKENS] = tokens
        mine[BACKLOG_REQUESTS] = requests
        mine[BACKLOG_SINCE] = since

    def publish_live_blocks(self, blocks: int, at: float) -> None:
        mine = self.mine
        mine[LIVE_BLOCKS] = blocks
        mine[LIVE_AT] = at

    def sibling_live_blocks(self, since: float) -> int:
        """The blocks the other workers counted as live on the engine (routing/live_set.py),
        each count taken at `since` or later (an older one may since have expired)."""
        rows = self.column.tolist()
        del rows[self.index]
        return int(sum(row[LIVE_BLOCKS] for row in rows if row[LIVE_AT] >= since))

    def sibling_backlogs(self) -> list[tuple[float, float, float]]:
        """(tokens, requests, since) of every other worker with a backlog on the engine."""
        rows = self.column.tolist()
        del rows[self.index]
        return [
            (row[BACKLOG_TOKENS], row[BACKLOG_REQUESTS], row[BACKLOG_SINCE])
            for row in rows
            if row[BACKLOG_REQUESTS] > 0
        ]


class LoadBoard:
    """One worker's handle on the board: its row to write, every row to read, and the engines
    it has joined (name -> cell)."""

    def __init__(self, path: str, worker: int) -> None:
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), 0)
        magic, workers, slots = _HEADER.unpack_from(self._map, 0)
        if magic != _MAGIC:
            raise ValueError(f"{path} is not a hiveroute load board")
        if not 0 <= worker < workers:
            raise ValueError(f"worker {worker} has no row on a board for {workers} workers")
        self.path, self.worker, self.workers, self.slots = path, worker, int(workers), int(slots)
        layout = _layout(self.workers, self.slots)
        self._hashes = np.frombuffer(self._map, np.uint64, self.slots, layout.hashes)
        self._holders = np.frombuffer(self._map, np.uint64, self.slots, layout.holders)
        self._cells = np.frombuffer(
            self._map, np.float64, self.workers * self.slots * FIELDS, layout.cells
        ).reshape(self.workers, self.slots, FIELDS)
        self._health = np.frombuffer(
            self._map, np.float64, self.slots * HEALTH_FIELDS, layout.health
        ).reshape(self.slots, HEALTH_FIELDS)
        self._reasons = memoryview(self._map)[layout.reasons : layout.size]
        self._joined: dict[str, tuple[int, EngineCell]] = {}
        self._warned_full = False

    @staticmethod
    def create(path: str, workers: int, slots: int = DEFAULT_SLOTS) -> None:
        """Lay out an empty board for `workers` workers at `path` (the parent, before any
        worker attaches); removing the file (with the run dir) is its end."""
        if not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"a load board holds 1..{MAX_WORKERS} workers, not {workers}")
        size = _layout(workers, slots).size
        with open(path, "wb") as file:
            file.write(_HEADER.pack(_MAGIC, workers, slots).ljust(_HEADER_BYTES, b"\0"))
            file.truncate(size)  # the rest reads as zeros: every slot empty, every count 0
        open(_lock_path(path), "wb").close()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(_lock_path(self.path), "ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def cell(self, name: str) -> EngineCell | None:
        """The engine's cell, if this worker has joined it (None: counted locally only)."""
        found = self._joined.get(name)
        return found[1] if found is not None else None

    def join(self, name: str) -> EngineCell | None:
        """This worker counts the engine on the board from now on: its slot (shared by every
        worker that joins the same name), or None when the table is full."""
        found = self._joined.get(name)
        if found is not None:
            return found[1]
        key = name_hash(name)
        bit = np.uint64(1 << self.worker)
        with self._locked():
            slot = self._find(key)
            if slot is None:
                slot = self._free_slot(key)
                if slot is None:
                    if not self._warned_full:
                        log.warning(
                            "the load board's %d engine slots are taken: engine %s (and any "
                            "other new one) is counted by each worker alone",
                            self.slots,
                            name,
                        )
                        self._warned_full = True
                    return None
                self._hashes[slot] = key
            if self._holders[slot] == 0:  # a slot new, or given back: no round in it yet
                self._health[slot] = 0.0
            self._holders[slot] |= bit
        self._cells[self.worker, slot] = 0.0
        cell = EngineCell(
            self._cells[:, slot],
            self.worker,
            self._health[slot],
            self._holders[slot : slot + 1],
            self._reasons[slot * REASON_BYTES : (slot + 1) * REASON_BYTES],
        )
        self._joined[name] = (slot, cell)
        return cell

    def leave(self, name: str) -> None:
        """The engine left this worker's pool: zero this worker's cell for it, stop writing to
        it, and give the slot back when no worker holds it any more."""
        found = self._joined.pop(name, None)
        if found is None:
            return
        slot, cell = found
        cell.detach()
        self._cells[self.worker, slot] = 0.0
        with self._locked():
            self._holders[slot] &= ~np.uint64(1 << self.worker)
            if self._holders[slot] == 0:
                self._hashes[slot] = _FREED

    def _probe(self, key: int) -> Iterator[int]:
        start = key % self.slots
        for step in range(self.slots):
            yield (start + step) % self.slots

    def _find(self, key: int) -> int | None:
        """The slot holding `key` (under the lock)."""
        for slot in self._probe(key):
            held = int(self._hashes[slot])
            if held == key:
                return slot
            if held == _EMPTY:
                return None
        return None

    def _free_slot(self, key: int) -> int | None:
        """The first slot on `key`'s probe path that is empty or given back (under the lock)."""
        for slot in self._probe(key):
            if int(self._hashes[slot]) in (_EMPTY, _FREED):
                return slot
        return None

    def close(self) -> None:
        """Stop writing to the board; the mapping goes with the last view of it."""
        for _, cell in self._joined.values():
            cell.detach()
        self._joined.clear()


def _lock_path(path: str) -> str:
    return path + ".lock"


def board_path(run_dir: str) -> str:
    """Where a run dir's board lives."""
    return os.path.join(run_dir, "load.board")
