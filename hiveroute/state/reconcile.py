"""Bringing Redis up to date when it returns after an outage.

Two cases, told apart by a generation marker (a random value under `<prefix>_generation`
that the first replica to find it missing writes):

- Redis kept its data (a network partition, a pause): the outage journal is merged key by key.
  A string goes back only if Redis still holds the value it had before the outage (so a home
  engine chosen locally never replaces a winner another replica put there: for a key that was
  absent this is set-if-absent); a hash field likewise, counters as increments; list entries
  are appended. Where Redis' value wins, the local copy takes it.
- Redis lost its data (restarted without persistence: the marker changed): the replica's whole
  local copy is written back where keys or fields are absent, so replicas fill it in together
  and the first to write a home engine keeps it; where another replica restored a counter
  first, this replica adds only the increments it made during the outage.
"""

from __future__ import annotations

import secrets
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING, Any

from hiveroute.state.journal import KeyChange
from hiveroute.state.redis_scripts import cas_args

if TYPE_CHECKING:
    from hiveroute.state.redis import RedisStateStore

MARKER = "_generation"
PASSES = 20  # journal passes before switching back (writes keep arriving meanwhile)
PUSH_BATCH = 1000


def _px(ttl_s: float | None) -> str:
    return "" if ttl_s is None else str(max(1, int(ttl_s * 1000)))


class Reconciler:
    marker = MARKER

    def __init__(self, store: RedisStateStore) -> None:
        self.store = store

    @property
    def redis(self) -> Any:
        return self.store.redis

    async def generation(self) -> str:
        """Redis' data generation; a new one when the marker is missing (its data was lost)."""
        key = self.store.k(MARKER)
        value: str | None = await self.redis.get(key)
        if value is None:
            await self.redis.set(key, secrets.token_hex(8), nx=True)
            value = await self.redis.get(key)
        return value or ""

    async def run(self) -> str:
        """Merge local changes into Redis; a one-line summary for the log. Raises on failure."""
        store = self.store
        generation = await store.raw(self.generation)
        results: Counter[str] = Counter()
        if store.generation is not None and generation != store.generation:
            changes, _ = store.journal.take()  # the whole copy below carries them too
            await self._restore_all(results, dict(changes))
        store.generation = generation
        overflowed = False
        for _ in range(PASSES):
            changes, lost = store.journal.take()
            overflowed = overflowed or lost
            if not changes:
                break
            for done, (key, change) in enumerate(changes):
                try:
                    result = await self._apply(key, change)
                except BaseException:
                    store.journal.restore(changes[done:])
                    raise
                results[result] += 1
                self._count(result)
        left = len(store.journal)
        if left:  # writes outpaced the passes: these stay local rather than go back stale
            store.journal.clear()
        parts = [f"{n} key(s) {result}" for result, n in sorted(results.items())]
        summary = "reconciled " + (", ".join(parts) if parts else "nothing")
        if results["restored"]:
            summary += " (Redis had lost its data: this replica's copy was written back)"
        if overflowed:
            summary += "; the outage journal was full, later local writes stay local"
        if left:
            summary += f"; {left} key(s) changed during reconciliation stay local"
        return summary

    def _count(self, result: str) -> None:
        if self.store.metrics is not None and result != "unchanged":
            self.store.metrics.reconciled_keys.labels(self.store.name, result).inc()

    # --- Redis kept its data: merge the journal -------------------------------------------

    async def _apply(self, key: str, change: KeyChange) -> str:
        store = self.store
        value, ttl_s = store.local.entry(key)
        result = "applied"
        if change.kind == "string":
            final = value if isinstance(value, str) else None
            if final == change.base:
                result = "unchanged"
            elif not await store.raw(
                partial(
                    store.scripts["COMPARE_AND_SET"],
                    keys=[store.k(key)],
                    args=cas_args(change.base, final, None),
                )
            ):
                result = "conflict"
        elif change.kind == "hash":
            result = await self._merge_hash(key, change, value if isinstance(value, dict) else {})
        elif change.kind == "list":
            if change.cleared:
                await store.raw(lambda: self.redis.delete(store.k(key)))
            pushed = change.pushed
            for start in range(0, len(pushed), PUSH_BATCH):
                batch = pushed[start : start + PUSH_BATCH]
                await store.raw(
                    lambda b=batch: store.scripts["PUSH_BOUNDED"](  # type: ignore[misc]
                        keys=[store.k(key)], args=[change.max_len, *b]
                    )
                )
        if ttl_s is not None and value is not None:
            await store.raw(lambda: self.redis.pexpire(store.k(key), int(_px(ttl_s))))
        if result == "conflict":  # Redis' value wins: the local copy takes it
            await self._refresh(key, change.kind)
        return result

    async def _merge_hash(self, key: str, change: KeyChange, final: dict[str, str]) -> str:
        args: list[str] = []
        for name, field in change.fields.items():
            if field.is_increment:
                assert field.delta is not None
                delta = repr(field.delta) if field.is_float else str(int(field.delta))
                args += ["f" if field.is_float else "i", name, delta, "", "", ""]
                continue
            present = name in final
            args += [
                "w" if field.force else "c",
                name,
                "0" if field.base is None else "1",
                field.base or "",
                "1" if present else "0",
                final.get(name, ""),
            ]
        if not args:
            return "unchanged"
        store = self.store
        conflicts = await store.raw(
            lambda: store.scripts["MERGE_HASH"](keys=[store.k(key)], args=args)
        )
        await self._refresh(key, "hash")  # counters now hold every replica's increments
        return "conflict" if conflicts else "applied"

    async def _refresh(self, key: str, kind: str) -> None:
        store = self.store
        if kind == "hash":
            pipe = self.redis.pipeline(transaction=False).hgetall(store.k(key)).pttl(store.k(key))
            mapping, pttl = await store.raw(pipe.execute)
            await store.mirror_hash(key, mapping, pttl)
        elif kind == "string":
            pipe = self.redis.pipeline(transaction=False).get(store.k(key)).pttl(store.k(key))
            value, pttl = await store.raw(pipe.execute)
            if value is None:
                await store.local.delete(key)
            else:
                await store.local.set(key, value, ttl_s=pttl / 1000 if pttl > 0 else None)

    # --- Redis lost its data: write the local copy back where absent ----------------------

    async def _restore_all(self, results: Counter[str], changes: dict[str, KeyChange]) -> None:
        store = self.store
        for key in store.local.live_keys():
            value, ttl_s = store.local.entry(key)
            k, px = store.k(key), _px(ttl_s)
            if isinstance(value, str):
                op = partial(self.redis.set, k, value, nx=True, px=int(px) if px else None)
            elif isinstance(value, dict) and value:
                change = changes.get(key)
                fields = change.fields if change is not None else {}
                args = [px]
                for name, field_value in value.items():
                    found = fields.get(name)
                    increment = ""
                    if found is not None and found.delta is not None:
                        kind = "f" if found.is_float else "i"
                        amount = repr(found.delta) if found.is_float else str(int(found.delta))
                        increment = kind + amount
                    args += [name, field_value, increment]
                op = partial(store.scripts["RESTORE_HASH"], keys=[k], args=args)
            elif isinstance(value, list) and value:
                op = partial(store.scripts["RESTORE_LIST"], keys=[k], args=[px, *value])
            else:
                continue
            if await store.raw(op):
                results["restored"] += 1
                self._count("restored")
