"""The KV-event subscriber against a ZMQ publisher the test drives."""

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import zmq.asyncio

from hiveroute.kvindex.index import KvIndex
from hiveroute.kvindex.subscriber import KvEventSubscriber
from tests.kvindex.zmq_publisher import FakePublisher, removed, stored, wait_until


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.term()


async def _subscribe(
    ctx: zmq.asyncio.Context, pub: FakePublisher, index: KvIndex, *, replay: bool = True
) -> KvEventSubscriber:
    sub = KvEventSubscriber(
        "e1",
        pub.endpoint,
        index,
        replay_endpoint=pub.replay_endpoint if replay else None,
        context=ctx,
        replay_timeout_s=2.0,
    )
    sub.start()
    await pub.wait_subscribed()
    await asyncio.wait_for(sub.synced.wait(), 5)
    return sub


async def test_events_build_exactly_the_engines_blocks(ctx: zmq.asyncio.Context) -> None:
    pub = FakePublisher(ctx)
    index = KvIndex()
    sub = await _subscribe(ctx, pub, index)
    try:
        await pub.publish([stored([1, 2], list(range(8)))])
        await pub.publish([stored([3], list(range(8, 12)), parent=2), removed([1])])
        await pub.publish([["BlockStored", [4], None, list(range(50, 54)), 4, None, "GPU"]])
        await wait_until(lambda: sub.stats.last_seq == 2)
        assert index.engine_hashes("e1") == pub.truth == {2, 3, 4}
        assert sub.stats.gaps_replayed == sub.stats.gaps_dropped == 0
        # one removal per block, as vLLM evicts: applied as one run, counted one by one
        await pub.publish([removed([2]), removed([3]), stored([5], list(range(60, 64)))])
        await wait_until(lambda: sub.stats.last_seq == 3)
        assert index.engine_hashes("e1") == pub.truth == {4, 5}
        assert sub.stats.events == 7
    finally:
        await sub.stop()
        await pub.close()


async def test_a_gap_is_filled_from_the_replay_socket(ctx: zmq.asyncio.Context) -> None:
    pub = FakePublisher(ctx)
    index = KvIndex()
    sub = await _subscribe(ctx, pub, index)
    try:
        await pub.publish([stored([1], list(range(4)))])
        await pub.publish([stored([2], list(range(4, 8)), parent=1)], lose=True)
        await pub.publish([removed([1])], lose=True)
        await pub.publish([stored([3], list(range(8, 12)), parent=2)])
        await wait_until(lambda: sub.stats.last_seq == 3)
        assert sub.stats.gaps_replayed == 1 and sub.stats.gaps_dropped == 0
        assert index.engine_hashes("e1") == pub.truth == {2, 3}
        assert index.orphans("e1") == 0
    finally:
        await sub.stop()
        await pub.close()


async def test_an_unreplayable_gap_drops_the_engines_entries(ctx: zmq.asyncio.Context) -> None:
    pub = FakePublisher(ctx)
    index = KvIndex()
    sub = await _subscribe(ctx, pub, index)
    try:
        await pub.publish([stored([1], list(range(4)))])
        await pub.publish([stored([2], list(range(100, 104)))], lose=True)
        pub.buffer.clear()  # the engine's replay buffer no longer reaches back
        await pub.publish([stored([3], list(range(200, 204)))])
        await wait_until(lambda: sub.stats.last_seq == 2)
        assert sub.stats.gaps_dropped == 1
        assert index.engine_hashes("e1") == {3}  # rebuilt from what followed, nothing stale
    finally:
        await sub.stop()
        await pub.close()


async def test_without_replay_socket_a_gap_drops_entries(ctx: zmq.asyncio.Context) -> None:
    pub = FakePublisher(ctx, replay=False)
    index = KvIndex()
    sub = await _subscribe(ctx, pub, index, replay=False)
    try:
        await pub.publish([stored([1], list(range(4)))])
        await pub.publish([removed([1])], lose=True)
        await pub.publish([stored([3], list(range(200, 204)))])
        await wait_until(lambda: sub.stats.last_seq == 2)
        assert sub.stats.gaps_dropped == 1 and index.engine_hashes("e1") == {3}
    finally:
        await sub.stop()
        await pub.close()


async def test_joining_late_catches_up_through_replay(ctx: zmq.asyncio.Context) -> None:
    pub = FakePublisher(ctx)
    index = KvIndex()
    await pub.publish([stored([1, 2], list(range(8)))])  # before anyone listened
    await pub.publish([removed([2])])
    sub = await _subscribe(ctx, pub, index)
    try:
        await pub.publish([stored([5], list(range(300, 304)))])
        await wait_until(lambda: sub.stats.last_seq == 2)
        assert index.engine_hashes("e1") == pub.truth == {1, 5}
        assert sub.stats.gaps_dropped == 0
    finally:
        await sub.stop()
        await pub.close()


async def test_engine_restart_resets_its_entries_and_reconnects(ctx: zmq.asyncio.Context) -> None:
    pub = FakePublisher(ctx)
    index = KvIndex()
    sub = await _subscribe(ctx, pub, index)
    try:
        for i in range(3):
            await pub.publish([stored([10 + i], list(range(i * 4, i * 4 + 4)))])
        await wait_until(lambda: sub.stats.last_seq == 2)
        ports = {"port": pub.port, "replay_port": pub.replay_port or 0}
        await pub.close()  # the engine goes away ...
        pub = FakePublisher(ctx, **ports)  # ... and comes back on the same endpoints
        # seq starts again at 0, published before ZMQ has reconnected (so the PUB drops it):
        # the resync on reconnection finds it in the replay buffer, though nothing follows
        await pub.publish([stored([99], list(range(500, 504)))])
        await wait_until(lambda: sub.stats.publisher_restarts == 1 and sub.stats.last_seq == 0)
        assert index.engine_hashes("e1") == {99}
    finally:
        await sub.stop()
        await pub.close()


async def test_a_restart_seen_first_as_a_gap_is_told_from_one(ctx: zmq.asyncio.Context) -> None:
    """The engine restarted without the subscriber reconnecting (so no resync ran), and its
    new sequence passed ours: the next message looks like a gap. The batch before the gap is
    not the one applied last (another timestamp), so the old run's entries go; replaying the
    new run from where ours stopped kept them, for blocks the new, empty cache lacks."""
    pub = FakePublisher(ctx)
    index = KvIndex()
    sub = await _subscribe(ctx, pub, index)
    try:
        for i in range(3):
            await pub.publish([stored([10 + i], list(range(i * 4, i * 4 + 4)))])
        await wait_until(lambda: sub.stats.last_seq == 2)
        assert index.engine_hashes("e1") == {10, 11, 12}
        time.sleep(0.002)  # the new run's batches carry later timestamps
        pub.buffer.clear()  # the engine restarts on the same sockets: a new run from seq 0
        pub.seq = 0
        pub.truth.clear()
        for i in range(4):  # published before the router heard of it (lost on the way)
            await pub.publish([stored([50 + i], list(range(100 + i * 4, 104 + i * 4)))], lose=True)
        await pub.publish([stored([60], list(range(300, 304)))])  # seq 4: past our 3
        await wait_until(lambda: sub.stats.last_seq == 4)
        assert sub.stats.publisher_restarts == 1 and sub.stats.gaps_replayed == 0
        assert index.engine_hashes("e1") == pub.truth == {50, 51, 52, 53, 60}
    finally:
        await sub.stop()
        await pub.close()


async def test_garbage_is_counted_and_skipped(ctx: zmq.asyncio.Context) -> None:
    pub = FakePublisher(ctx)
    index = KvIndex()
    sub = await _subscribe(ctx, pub, index)
    try:
        await pub.pub.send_multipart([b"kv-events", b"\x00" * 8, b"\xc1"])
        await pub.pub.send_multipart([b"only-one-frame"])
        await pub.publish([stored([1], list(range(4)))])
        await wait_until(lambda: sub.stats.last_seq == 0)
        assert sub.stats.decode_errors == 2 and index.engine_hashes("e1") == {1}
    finally:
        await sub.stop()
        await pub.close()


async def test_a_batch_of_malformed_events_is_counted_and_the_subscription_goes_on(
    ctx: zmq.asyncio.Context,
) -> None:
    """Token ids that are not integers (a publisher's bug) raised a TypeError that the
    subscriber took for a broken socket: it reconnected, and its resync, replaying the same
    batch, died. Now the batch is a decode error like any other: skipped live, skipped in the
    replay that the gap it leaves asks for, and the engine's entries rebuilt from there."""
    pub = FakePublisher(ctx)
    index = KvIndex()
    sub = await _subscribe(ctx, pub, index)
    try:
        await pub.publish([stored([1], list(range(4)))])
        await pub.publish(
            [{**stored([2], list(range(4, 8)), parent=1), "token_ids": [4, None, 6, 7]}]
        )
        await pub.publish([stored([3], list(range(8, 12)))])
        await wait_until(lambda: sub.stats.last_seq == 2)
        assert sub.stats.decode_errors == 2  # live, then in the replay
        assert sub.stats.gaps_dropped == 1 and index.engine_hashes("e1") == {3}
        await pub.publish([stored([4], list(range(12, 16)), parent=3)])
        await wait_until(lambda: sub.stats.last_seq == 3)
        assert index.engine_hashes("e1") == {3, 4}
    finally:
        await sub.stop()
        await pub.close()


async def test_a_detached_subscriber_writes_nothing_more(ctx: zmq.asyncio.Context) -> None:
    """An engine that left the pool has its entries cleared while its subscriber is still
    stopping: a batch read then must not bring them back (a ghost engine in the index)."""
    pub = FakePublisher(ctx)
    index = KvIndex()
    sub = await _subscribe(ctx, pub, index)
    try:
        await pub.publish([stored([1], list(range(4)))])
        await wait_until(lambda: sub.stats.last_seq == 0)
        sub.detach()
        index.remove_engine("e1")  # as the KV event service does next
        await pub.publish([stored([2], list(range(4, 8)), parent=1)])
        await pub.pub.send_multipart([b"kv-events", b"\x00" * 8, b"\xc1"])  # read after it
        await wait_until(lambda: sub.stats.decode_errors == 1)
        assert "e1" not in index.engines() and len(index) == 0
    finally:
        await sub.stop()
        await pub.close()


async def test_stopping_during_a_replay_leaves_no_socket_open(ctx: zmq.asyncio.Context) -> None:
    """A subscriber stopped while it waits for a replay (a gap, a replay socket that does not
    answer) closes that socket before `stop` returns: the router terminates the ZMQ context
    next, and one socket left open blocks that call, and the event loop, for good."""
    silent = ctx.socket(zmq.ROUTER)  # takes the replay request, never answers
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    pub = FakePublisher(ctx, replay=False)
    index = KvIndex()
    sub = KvEventSubscriber(
        "e1", pub.endpoint, index, replay_endpoint=f"tcp://127.0.0.1:{port}", context=ctx,
        replay_timeout_s=60.0,
    )  # fmt: skip
    sub.start()
    await pub.wait_subscribed()
    try:
        pub.seq = 5  # the first batch it hears is 5: 0..4 to replay first
        await pub.publish([stored([1], list(range(4)))])
        await silent.recv_multipart()  # the replay was asked for, and waits
        await sub.stop()
        open_sockets = [s for s in ctx._sockets if not s.closed and s is not silent]  # type: ignore[attr-defined]
        assert [s.socket_type for s in open_sockets] == [zmq.XPUB]  # the publisher's own
    finally:
        await sub.stop()
        silent.close(linger=0)
        await pub.close()


async def test_a_backlog_of_messages_leaves_room_for_other_tasks(ctx: zmq.asyncio.Context) -> None:
    """Messages that are already waiting are read without the event loop running anything
    else in between; an engine's burst of evictions must not hold up the requests the router
    is serving, so the subscriber gives the loop a turn after each message."""
    pub = FakePublisher(ctx)
    index = KvIndex()
    sub = await _subscribe(ctx, pub, index)
    applied_at_tick: list[int] = []

    async def tick() -> None:
        while True:
            applied_at_tick.append(sub.stats.batches)
            await asyncio.sleep(0)

    ticker = asyncio.get_running_loop().create_task(tick())
    try:
        ticker.cancel()  # stopped while the backlog builds: the messages queue in the socket
        await asyncio.gather(ticker, return_exceptions=True)
        before = sub.stats.batches
        for i in range(40):
            await pub.publish([stored([100 + i], list(range(4 * i, 4 * i + 4)))])
        time.sleep(0.3)  # the loop does not run: all 40 arrive and wait in the socket
        applied_at_tick.clear()
        ticker = asyncio.get_running_loop().create_task(tick())
        await wait_until(lambda: sub.stats.batches == before + 40)
        during = {n for n in applied_at_tick if before < n < before + 40}
        assert len(during) >= 20  # the ticker ran between most of the messages
    finally:
        ticker.cancel()
        await sub.stop()
        await pub.close()


async def test_a_failure_applying_a_message_reconnects_and_catches_up(
    ctx: zmq.asyncio.Context, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug met while applying one message must not end the subscription: the subscriber
    logs it, opens its socket again, and the resynchronisation replays what it missed."""
    pub = FakePublisher(ctx)
    index = KvIndex()
    sub = await _subscribe(ctx, pub, index)
    real_apply = index.apply
    failures = []

    def apply_failing_once(engine: str, event: object) -> None:
        if not failures:
            failures.append(event)
            raise RuntimeError("a bug in the index")
        real_apply(engine, event)  # type: ignore[arg-type]

    monkeypatch.setattr(index, "apply", apply_failing_once)
    try:
        await pub.publish([stored([1], list(range(4)))])  # seq 0: its apply fails
        await wait_until(lambda: bool(failures))
        await pub.publish([stored([2], list(range(4, 8)), parent=1)])
        await wait_until(lambda: index.engine_hashes("e1") == {1, 2}, timeout_s=10)
        assert "KV-event subscriber for e1 failed; reconnecting" in caplog.text
        assert sub.stats.last_seq == 1
    finally:
        await sub.stop()
        await pub.close()
