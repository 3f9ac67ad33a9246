"""Request ids the router makes up: unique per request, and per process after a fork."""

import os
import re

from hiveroute.gateway.request_ids import RequestIdSource

ID = re.compile(r"hr-[0-9a-f]{32}")


def test_ids_are_unique_and_keep_their_shape() -> None:
    source = RequestIdSource()
    ids = [source.new() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(ID.fullmatch(i) for i in ids)
    assert RequestIdSource().new() != RequestIdSource().new()  # two processes' prefixes differ


def test_a_forked_child_draws_its_own_prefix() -> None:
    source = RequestIdSource()
    before = source.new()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, to the parent
        os.write(write, source.new().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    os.close(read)
    after = source.new()
    assert ID.fullmatch(child)
    assert child[:19] != before[:19]  # "hr-" and the 16 hex digits of the prefix
    assert after[:19] == before[:19] and after != before
