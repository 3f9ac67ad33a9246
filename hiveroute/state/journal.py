"""The outage journal: what a replica changed in its local state while the shared store was down.

It records, per key, enough to merge the change back without overwriting what other replicas
wrote meanwhile: the value a string or hash field had before the outage (the base: a write goes
back only if the shared store still holds it, so a home engine chosen locally never replaces a
winner already there), the sum of counter increments (replayed as increments, which commute),
and the values pushed onto bounded lists. It is called before the local write, so the local
store still holds the base. Bounded: past `max_keys` keys, further changes are not recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hiveroute.state.memory import MemoryStateStore

DEFAULT_MAX_KEYS = 100_000


@dataclass
class FieldChange:
    """A hash field's change: an increment (`delta`), or a write from `base` (None: absent)
    that goes back only if the field still holds `base` (always, if `force`)."""

    delta: float | None = None
    is_float: bool = False
    base: str | None = None
    force: bool = False

    @property
    def is_increment(self) -> bool:
        return self.delta is not None


@dataclass
class KeyChange:
    kind: str  # "string", "hash", "list" or "ttl" (only the TTL was renewed)
    base: str | None = None  # strings: the value before the outage
    fields: dict[str, FieldChange] = field(default_factory=dict)
    pushed: list[str] = field(default_factory=list)
    max_len: int = 0
    cleared: bool = False  # lists: deleted during the outage (then maybe pushed to again)


class Journal:
    def __init__(self, local: MemoryStateStore, *, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.local = local
        self.max_keys = max_keys
        self.changes: dict[str, KeyChange] = {}
        self.overflowed = False  # some change was not recorded (cleared by `take`)

    def __len__(self) -> int:
        return len(self.changes)

    def _change(self, key: str, kind: str) -> KeyChange | None:
        found = self.changes.get(key)
        if found is not None and (found.kind == kind or kind == "ttl"):
            return found
        if found is None and len(self.changes) >= self.max_keys:
            self.overflowed = True
            return None
        if found is not None and found.kind != "ttl":  # the key changed type: keep the newest
            del self.changes[key]
        base = self.local.entry(key, copy=False)[0] if kind == "string" else None
        change = KeyChange(kind=kind, base=base if isinstance(base, str) else None)
        self.changes[key] = change
        return change

    def string(self, key: str) -> None:
        """`key` is about to be set, compare-and-set or deleted as a string."""
        self._change(key, "string")

    def fields(self, key: str, names: list[str]) -> None:
        """Fields of hash `key` are about to be written or deleted."""
        change = self._change(key, "hash")
        if change is None:
            return
        current = self.local.entry(key, copy=False)[0]
        current = current if isinstance(current, dict) else {}
        for name in names:
            found = change.fields.get(name)
            if found is None:
                change.fields[name] = FieldChange(base=current.get(name))
            elif found.is_increment:  # written after increments: last write wins for it
                change.fields[name] = FieldChange(force=True)

    def increment(self, key: str, name: str, amount: float, *, is_float: bool) -> None:
        change = self._change(key, "hash")
        if change is None:
            return
        found = change.fields.get(name)
        if found is None:
            change.fields[name] = FieldChange(delta=amount, is_float=is_float)
        elif found.is_increment:
            assert found.delta is not None
            found.delta += amount
            found.is_float = found.is_float or is_float
        # a field written during the outage goes back as its final value: nothing to add

    def push(self, key: str, value: str, max_len: int) -> None:
        change = self._change(key, "list")
        if change is None:
            return
        change.pushed.append(value)
        del change.pushed[: max(0, len(change.pushed) - max_len)]
        change.max_len = max_len

    def deleted(self, key: str) -> None:
        value = self.local.entry(key, copy=False)[0]
        if isinstance(value, dict):
            self.fields(key, list(value))
        elif isinstance(value, list):
            change = self._change(key, "list")
            if change is not None:
                change.cleared = True
                change.pushed.clear()
        elif isinstance(value, str):
            self.string(key)

    def renewed(self, key: str) -> None:
        """The key's TTL changed: reconciling renews it in the shared store too."""
        if key not in self.changes:
            self._change(key, "ttl")

    def take(self) -> tuple[list[tuple[str, KeyChange]], bool]:
        """Every recorded change (oldest first) and whether some were not recorded; clears."""
        taken = list(self.changes.items())
        overflowed = self.overflowed
        self.changes = {}
        self.overflowed = False
        return taken, overflowed

    def restore(self, unapplied: list[tuple[str, KeyChange]]) -> None:
        """Put back changes a failed reconciliation did not apply, merged with newer ones."""
        newer = self.changes
        self.changes = dict(unapplied)
        for key, change in newer.items():
            old = self.changes.get(key)
            if old is None or old.kind != change.kind:
                self.changes[key] = change
            elif change.kind == "string":
                pass  # the older record holds the base from before the outage
            elif change.kind == "list":
                old.cleared = old.cleared or change.cleared
                old.pushed = [] if change.cleared else old.pushed
                old.pushed.extend(change.pushed)
                old.max_len = change.max_len
            elif change.kind == "hash":
                for name, field_change in change.fields.items():
                    before = old.fields.get(name)
                    if before is None:
                        old.fields[name] = field_change
                    elif before.is_increment and field_change.is_increment:
                        assert before.delta is not None and field_change.delta is not None
                        before.delta += field_change.delta
                        before.is_float = before.is_float or field_change.is_float
                    elif before.is_increment:  # written after increments: last write wins
                        old.fields[name] = FieldChange(force=True)

    def clear(self) -> None:
        self.take()
