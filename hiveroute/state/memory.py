"""The in-memory state store: one router process, no dependencies (the default).

Expiry is lazy (checked on access) plus a periodic sweep on writes, so memory stays bounded by
live keys. The clock is injectable so tests can expire keys without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

SWEEP_EVERY_WRITES = 1024


class MemoryStateStore:
    name = "memory"
    in_process = True

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._data: dict[str, Any] = {}  # str | dict[str, str] | list[str]
        self._expiry: dict[str, float] = {}
        self._writes = 0

    # internals ------------------------------------------------------------------------------

    def _alive(self, key: str) -> bool:
        deadline = self._expiry.get(key)
        if deadline is not None and deadline <= self.clock():
            self._data.pop(key, None)
            self._expiry.pop(key, None)
            return False
        return key in self._data

    def _wrote(self, key: str, ttl_s: float | None, *, keep_ttl: bool = False) -> None:
        if ttl_s is not None:
            self._expiry[key] = self.clock() + ttl_s
        elif not keep_ttl:
            self._expiry.pop(key, None)
        self._writes += 1
        if self._writes % SWEEP_EVERY_WRITES == 0:
            now = self.clock()
            for stale in [k for k, t in self._expiry.items() if t <= now]:
                self._data.pop(stale, None)
                self._expiry.pop(stale, None)

    def _typed(self, key: str, kind: type) -> Any:
        if not self._alive(key):
            return None
        value = self._data[key]
        if not isinstance(value, kind):
            raise TypeError(
                f"state key {key!r} holds a {type(value).__name__}, not {kind.__name__}"
            )
        return value

    # strings --------------------------------------------------------------------------------

    async def get(self, key: str) -> str | None:
        value: str | None = self._typed(key, str)
        return value

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        self._data[key] = value
        self._wrote(key, ttl_s)

    async def set_if_absent(self, key: str, value: str, *, ttl_s: float | None = None) -> bool:
        if self._alive(key):
            return False
        await self.set(key, value, ttl_s=ttl_s)
        return True

    async def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> bool:
        current = self._typed(key, str)
        if current != expected:
            return False
        await self.set(key, value, ttl_s=ttl_s)
        return True

    async def delete(self, *keys: str) -> int:
        removed = 0
        for key in keys:
            if self._alive(key):
                removed += 1
            self._data.pop(key, None)
            self._expiry.pop(key, None)
        return removed

    async def expire(self, key: str, ttl_s: float | None) -> bool:
        if not self._alive(key):
            return False
        if ttl_s is None:
            self._expiry.pop(key, None)
        else:
            self._expiry[key] = self.clock() + ttl_s
        return True

    async def scan(self, prefix: str, *, limit: int = 10_000) -> list[str]:
        found: list[str] = []
        for key in list(self._data):
            if key.startswith(prefix) and self._alive(key):
                found.append(key)
                if len(found) >= limit:
                    break
        return found

    # hashes ---------------------------------------------------------------------------------

    def _hash(self, key: str, create: bool) -> dict[str, str] | None:
        found: dict[str, str] | None = self._typed(key, dict)
        if found is None and create:
            found = self._data[key] = {}
        return found

    async def hget(self, key: str, field: str) -> str | None:
        found = self._hash(key, False)
        return None if found is None else found.get(field)

    async def hgetall(self, key: str) -> dict[str, str]:
        found = self._hash(key, False)
        return dict(found) if found else {}

    async def hset(self, key: str, mapping: dict[str, str]) -> None:
        found = self._hash(key, True)
        assert found is not None
        found.update(mapping)
        self._wrote(key, None, keep_ttl=True)

    async def hdel(self, key: str, *fields: str) -> int:
        found = self._hash(key, False)
        if not found:
            return 0
        removed = sum(1 for f in fields if found.pop(f, None) is not None)
        if not found:
            await self.delete(key)
        return removed

    async def hincrby(self, key: str, field: str, amount: int = 1) -> int:
        found = self._hash(key, True)
        assert found is not None
        value = int(found.get(field, "0")) + amount
        found[field] = str(value)
        self._wrote(key, None, keep_ttl=True)
        return value

    async def hincrby_many(self, key: str, increments: dict[str, int]) -> dict[str, int]:
        found = self._hash(key, True)
        assert found is not None
        values: dict[str, int] = {}
        for field, amount in increments.items():
            value = values[field] = int(found.get(field, "0")) + amount
            found[field] = str(value)
        self._wrote(key, None, keep_ttl=True)
        return values

    async def hincrbyfloat(self, key: str, field: str, amount: float) -> float:
        found = self._hash(key, True)
        assert found is not None
        value = float(found.get(field, "0")) + amount
        found[field] = repr(value)
        self._wrote(key, None, keep_ttl=True)
        return value

    # bounded lists --------------------------------------------------------------------------

    async def push_bounded(self, key: str, value: str, max_len: int) -> list[str]:
        if max_len <= 0:
            raise ValueError("max_len must be positive")
        found: list[str] | None = self._typed(key, list)
        if found is None:
            found = self._data[key] = []
        found.append(value)
        dropped: list[str] = []
        if len(found) > max_len:
            dropped = found[: len(found) - max_len]
            del found[: len(found) - max_len]
        self._wrote(key, None, keep_ttl=True)
        return dropped

    async def lrange(self, key: str, start: int = 0, stop: int = -1) -> list[str]:
        found: list[str] | None = self._typed(key, list)
        if not found:
            return []
        end = None if stop == -1 else stop + 1
        return list(found[start:end])

    # mirroring (a cache of another store reads these) -----------------------------------------

    def entry(
        self, key: str, *, copy: bool = True
    ) -> tuple[str | dict[str, str] | list[str] | None, float | None]:
        """A live key's value and its remaining TTL in seconds (None: no TTL). The value is a
        copy unless `copy` is False (then the caller must not change it)."""
        if not self._alive(key):
            return None, None
        value = self._data[key]
        if copy and isinstance(value, dict):
            value = dict(value)
        elif copy and isinstance(value, list):
            value = list(value)
        deadline = self._expiry.get(key)
        return value, None if deadline is None else max(0.0, deadline - self.clock())

    def live_keys(self) -> list[str]:
        """Every live key (for a full copy into another store)."""
        return [key for key in list(self._data) if self._alive(key)]

    async def close(self) -> None:
        self._data.clear()
        self._expiry.clear()
