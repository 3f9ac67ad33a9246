"""The outage journal: bases taken before local writes, increments summed, bounded, and merged
back after a failed reconciliation without losing what came after."""

from hiveroute.state.journal import Journal
from hiveroute.state.memory import MemoryStateStore


async def test_records_bases_increments_and_pushes() -> None:
    local = MemoryStateStore()
    await local.set("s", "before")
    await local.hset("h", {"a": "1"})
    journal = Journal(local)
    journal.string("s")
    await local.set("s", "during")
    journal.string("s")  # a second write keeps the base from before the outage
    journal.fields("h", ["a", "b"])
    journal.increment("h", "n", 2, is_float=False)
    journal.increment("h", "n", 3, is_float=False)
    journal.increment("h", "f", 0.5, is_float=True)
    for value in ("x", "y", "z"):
        journal.push("l", value, 2)
    changes, overflowed = journal.take()
    by_key = dict(changes)
    assert not overflowed and len(journal) == 0
    assert by_key["s"].kind == "string" and by_key["s"].base == "before"
    fields = by_key["h"].fields
    assert fields["a"].base == "1" and fields["b"].base is None and not fields["a"].force
    assert fields["n"].delta == 5 and fields["f"].is_float
    assert by_key["l"].pushed == ["y", "z"] and by_key["l"].max_len == 2


async def test_deletes_become_field_and_list_changes() -> None:
    local = MemoryStateStore()
    await local.hset("h", {"a": "1", "b": "2"})
    await local.push_bounded("l", "x", 5)
    journal = Journal(local)
    journal.push("l", "y", 5)
    journal.deleted("h")
    journal.deleted("l")
    journal.deleted("missing")  # nothing known locally: nothing to send back
    changes = dict(journal.take()[0])
    assert set(changes["h"].fields) == {"a", "b"} and changes["h"].fields["b"].base == "2"
    assert changes["l"].cleared and changes["l"].pushed == []
    assert "missing" not in changes


async def test_write_after_increment_wins_and_bound_is_kept() -> None:
    journal = Journal(MemoryStateStore(), max_keys=2)
    journal.increment("h", "n", 1, is_float=False)
    journal.fields("h", ["n"])
    assert journal.changes["h"].fields["n"].force
    journal.string("a")
    journal.string("b")  # a third key: not recorded
    journal.renewed("c")
    assert set(journal.changes) == {"h", "a"} and journal.overflowed
    _, overflowed = journal.take()
    assert overflowed and not journal.overflowed


async def test_restore_merges_unapplied_changes_with_newer_ones() -> None:
    local = MemoryStateStore()
    await local.set("s", "pre")
    journal = Journal(local)
    journal.string("s")
    journal.increment("h", "n", 2, is_float=False)
    journal.increment("h", "m", 1, is_float=False)
    journal.push("l", "a", 10)
    unapplied, _ = journal.take()
    await local.set("s", "later")  # while reconciling, more local writes arrive
    journal.string("s")
    journal.increment("h", "n", 3, is_float=False)
    journal.fields("h", ["m"])
    journal.push("l", "b", 10)
    journal.restore(unapplied)
    merged = journal.changes
    assert merged["s"].base == "pre"  # the base from before the outage
    assert merged["h"].fields["n"].delta == 5
    assert merged["h"].fields["m"].force  # written after an increment: last write wins
    assert merged["l"].pushed == ["a", "b"]
