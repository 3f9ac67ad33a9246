"""Chunk encodings shared by the workers of one `hiveroute serve --workers N`.

Each worker has its own prefix encode cache (prefix_cache.py). The kernel spreads connections
over the workers, so the agents of one workflow reach both: a sibling served by the other
worker tokenized the workflow's 32k-token context again, 10-30 ms in its handler before the
engine saw it. A context cut into content-defined chunks by one worker is cut at the same
points by the other, so each chunk's encoding is worth sharing: one file per chunk, named by a
hash of its text, in a directory the parent made (in /dev/shm: memory, not disk). A worker
reads a sibling's chunk in tens of microseconds instead of encoding it in milliseconds.

Files are written whole under a temporary name and renamed, so a reader sees a complete file
or none. Each worker removes the oldest files it wrote once they hold more than its share of
`max_tokens`; a file a sibling is reading stays readable until it is closed. The store is a
cache: any failure to read or write is a miss, never an error on a request.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from prometheus_client.core import CounterMetricFamily, Metric

# each token's start offset in its chunk, as prefix_cache.py keeps them
Starts = npt.NDArray[np.int64]

log = logging.getLogger("hiveroute.kvindex")

SUFFIX = ".chunk"
_HEADER = 8  # bytes of the token count that starts a file


def chunk_name(chunk: str) -> str:
    """The file name of a chunk's encoding: a 128-bit hash of its text."""
    return hashlib.blake2b(chunk.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class SharedChunkStore:
    """Token ids and start offsets of text chunks, readable by every worker of one router.

    Each worker makes its own store on the same directory; `max_tokens` is this worker's share
    of what the directory may hold (8 bytes a token)."""

    def __init__(self, directory: str | Path, *, max_tokens: int) -> None:
        if max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._prefix = str(self.directory) + os.sep  # paths are joined on every request
        self.max_tokens = max_tokens
        self._written: OrderedDict[str, int] = OrderedDict()  # name -> tokens, oldest first
        self._tokens = 0
        self._warned = False
        self.found = 0  # chunks read from the directory
        self.published = 0  # chunks this worker wrote

    @property
    def tokens(self) -> int:
        """Token ids in the files this worker wrote and has not removed."""
        return self._tokens

    def get(self, chunk: str) -> tuple[list[int], Starts] | None:
        """`chunk`'s ids and token start offsets, if a worker stored them; else None."""
        try:
            fd = os.open(self._path(chunk_name(chunk)), os.O_RDONLY)
        except OSError:
            return None
        try:
            data = os.read(fd, os.fstat(fd).st_size)
        except OSError:
            return None
        finally:
            os.close(fd)
        count = int.from_bytes(data[:_HEADER], "little") if len(data) >= _HEADER else 0
        if count <= 0 or len(data) != _HEADER + 8 * count:
            return None
        ids = np.frombuffer(data, np.int32, count, _HEADER).tolist()
        starts = np.frombuffer(data, np.int32, count, _HEADER + 4 * count).astype(np.int64)
        self.found += 1
        return ids, starts

    def put(self, chunk: str, ids: Sequence[int], starts: Starts) -> None:
        """Store `chunk`'s encoding for the siblings, unless a worker already did."""
        if not ids or len(ids) != len(starts):
            return
        name = chunk_name(chunk)
        path = self._path(name)
        if name in self._written or os.path.exists(path):
            return
        try:  # the count, then ids and starts as 32-bit ints
            values = np.fromiter(ids, np.int32, len(ids))
        except OverflowError:  # an id past 2**31: not a vocabulary this store can hold
            return
        parts: list[bytes | memoryview] = [
            len(ids).to_bytes(_HEADER, "little"),
            values.data,
            starts.astype(np.int32).data,
        ]
        temporary = f"{self._prefix}.{name}.{os.getpid()}"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.writev(fd, parts)
            finally:
                os.close(fd)
            os.replace(temporary, path)
        except OSError as exc:
            self._warn(exc)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            return
        self._written[name] = len(ids)
        self._tokens += len(ids)
        self.published += 1
        while self._tokens > self.max_tokens and len(self._written) > 1:
            old, tokens = self._written.popitem(last=False)
            self._tokens -= tokens
            with contextlib.suppress(OSError):
                os.unlink(self._path(old))

    def _path(self, name: str) -> str:
        return self._prefix + name + SUFFIX

    def _warn(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "cannot share tokenized chunks in %s (%s): each worker tokenizes on its own",
                self.directory,
                exc.strerror or exc,
            )


class SharedChunksCollector:
    """Prometheus view of one worker's use of the shared chunks (summed over workers)."""

    def __init__(self, store: SharedChunkStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        chunks = CounterMetricFamily(
            "hiveroute_tokenizer_shared_chunks",
            "Tokenized prompt chunks the workers shared: found (read from a sibling instead of"
            " tokenized) or published (written for the siblings)",
            labels=["outcome"],
        )
        chunks.add_metric(["found"], self.store.found)
        chunks.add_metric(["published"], self.store.published)
        yield chunks
