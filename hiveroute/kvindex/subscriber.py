"""One engine's KV-event stream, applied to the index: subscribe, notice gaps, replay, restart.

vLLM numbers its event batches 0, 1, 2, … A number higher than the next expected one means
batches were lost (the SUB socket dropped them, or we joined late): the subscriber asks the
engine's replay socket (ROUTER; we talk to it with a DEALER) for the batches from the first
missing one, and the engine answers with what its buffer still holds, then a -1 marker. When the
buffer no longer reaches back far enough, or there is no replay socket, that engine's entries
are dropped and rebuilt from the events that follow. A number lower than expected means the
publisher restarted (the engine restarted): its cache is empty, so are its entries. ZMQ itself
reconnects to a restarted engine; heartbeats notice a silent peer.

Messages published while the SUB socket was (re)connecting are lost without a trace until the
next one arrives, so every (re)connection also resynchronises at once: it replays from the last
batch applied and checks it is the same batch (same timestamp); if not, the publisher restarted
and the engine's entries are rebuilt from its buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from hiveroute.kvindex.events import EventBatch, EventDecodeError, decode_message
from hiveroute.kvindex.index import KvIndex
from hiveroute.lifecycle import cancel_and_wait

log = logging.getLogger("hiveroute.kvindex.events")

END_SEQ = -1
MAX_REPLAY_BATCHES = 200_000
RECENT_BATCHES = 4096


@dataclass
class SubscriberStats:
    batches: int = 0
    events: int = 0
    decode_errors: int = 0
    gaps_replayed: int = 0
    gaps_dropped: int = 0
    publisher_restarts: int = 0
    last_seq: int | None = None
    # Seconds from the engine stamping its latest applied batch to the router applying it
    # (two clocks: skew between the hosts adds to it).
    lag_s: float | None = None


class KvEventSubscriber:
    """Subscribes to one engine's KV events and keeps the index in step with them."""

    def __init__(
        self,
        engine: str,
        endpoint: str,
        index: KvIndex,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        context: zmq.asyncio.Context | None = None,
        replay_timeout_s: float = 2.0,
    ) -> None:
        self.engine = engine
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.index = index
        self.topic = topic.encode()
        self.replay_timeout_s = replay_timeout_s
        self.stats = SubscriberStats()
        self._own_context = context is None
        self._context = context or zmq.asyncio.Context()
        self._socket: zmq.Socket[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._expected: int | None = None
        self._last_ts: float | None = None
        self._recent: dict[int, float] = {}  # seq -> ts of the last batches applied
        self._lock = asyncio.Lock()  # one message or resync at a time
        self._monitor_task: asyncio.Task[None] | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        # the SUB socket is read through a plain (synchronous) socket and a reader on its file
        # descriptor: pyzmq's asyncio receive costs a future and its bookkeeping per message,
        # and an engine publishes one message per scheduler step (about 6 % of the router's
        # CPU in the matrix's cells, benchmarks/results/router_cpu_real_workloads.md)
        self._sync_context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(
            self._context.underlying
        )
        self._reading: asyncio.Task[None] | None = None  # a message on the async path
        self._failed: asyncio.Future[None] | None = None  # the reader's error ends `_run`'s wait
        self._detached = False  # see `detach`
        self.connected = asyncio.Event()  # set once the SUB socket is connected
        self.synced = asyncio.Event()  # set once the first connection's catch-up is done

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start receiving in a background task (await `connected` to know the socket is up)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"kv-events-{self.engine}"
            )

    def detach(self) -> None:
        """Write nothing more to the index, from now on: the engine left the pool or was
        replaced under its name, and its entries are cleared right after. `stop` (which
        awaits) closes the sockets later; until then a batch read or a replay answered would
        bring the old engine's entries back."""
        self._detached = True

    async def stop(self) -> None:
        self.detach()
        await cancel_and_wait(self._monitor_task)
        await cancel_and_wait(self._task)
        self._monitor_task = None
        self._task = None
        # A replay in progress holds a socket of the context open. Taken only now: while the
        # tasks above ended, the socket could still be read, and a message needing a replay
        # started one (a busy machine's test left its socket open, and terminating the context
        # would have hung on it). Once `_close_socket` has run, nothing reads any more.
        reading = self._reading
        self._close_socket()
        if reading is not None:  # cancelled by `_close_socket`: let it close its socket
            await asyncio.gather(reading, return_exceptions=True)
        if self._own_context:
            self._context.destroy(linger=0)

    def _open_socket(self) -> zmq.Socket[bytes]:
        sock: zmq.Socket[bytes] = self._sync_context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 6000)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic)
        # the monitor first: a connection made before it exists would go unnoticed; it is read
        # by an asyncio socket of the same context (inproc reaches across the shadow)
        address = f"inproc://kv-events-monitor-{id(sock):x}"
        sock.monitor(address, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self._monitor = self._context.socket(zmq.PAIR)
        self._monitor.connect(address)
        sock.connect(self.endpoint)
        return sock

    def _close_socket(self) -> None:
        if self._monitor_task is not None:
            self._monitor_task.cancel()
            self._monitor_task = None
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None
        # Stop monitoring while the monitor's pair socket is still open: libzmq tells that
        # socket the monitor stopped, and with its peer already closed the call could hang.
        if self._socket is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._socket.disable_monitor()
        if self._monitor is not None:  # closed here: a task cancelled unstarted runs no finally
            self._monitor.close(linger=0)
            self._monitor = None
        if self._socket is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._socket.FD)
            self._socket.close(linger=0)
            self._socket = None

    async def _run(self) -> None:
        backoff = 0.1
        loop = asyncio.get_running_loop()
        while True:
            applied = self.stats.batches
            try:
                self._socket = self._open_socket()
                assert self._monitor is not None
                self._monitor_task = loop.create_task(
                    self._watch(self._monitor), name=f"kv-events-monitor-{self.engine}"
                )
                self._failed = loop.create_future()
                loop.add_reader(self._socket.FD, self._read)
                self.connected.set()
                self._read()  # the descriptor signals changes only: read what is there now
                await self._failed
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug or a broken socket must not end the subscription
                log.exception("KV-event subscriber for %s failed; reconnecting", self.engine)
                self._close_socket()
                if self.stats.batches > applied:  # the connection worked: start the wait anew
                    backoff = 0.1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _read(self) -> None:
        """Apply one waiting message, then give the loop a turn before the next: a backlog (an
        engine evicting under load) must not hold up the requests the router is serving. A
        message that needs a replay first, or that arrives during a resynchronisation, goes
        the async way (`_handle`), and reading waits until it is applied."""
        if self._socket is None or self._reading is not None:
            return
        try:
            frames = self._socket.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return  # nothing waiting: the descriptor will say when there is
        except Exception as exc:  # handed to `_run`, which reconnects
            self._fail(exc)
            return
        loop = asyncio.get_running_loop()
        try:
            batch = self._decode(frames)
            if batch is not None and (self._lock.locked() or not self._handle_now(batch)):
                self._reading = loop.create_task(self._handle_later(batch))
                return
        except Exception as exc:  # handed to `_run`, which reconnects
            self._fail(exc)
            return
        self._read_next(loop)

    def _read_next(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the next message on the loop's next turn if one is waiting. The socket is
        asked (`EVENTS`, which also re-arms its descriptor) rather than tried: a receive that
        finds nothing raises, and one did after nearly every message; without them the reader
        costs a worker 11 % less CPU (benchmarks/results/kv_read_events.md)."""
        socket = self._socket
        if socket is None:
            return
        try:
            waiting = cast(int, socket.get(zmq.EVENTS)) & zmq.POLLIN
        except zmq.ZMQError as exc:  # handed to `_run`, which reconnects
            self._fail(exc)
            return
        if waiting:
            loop.call_soon(self._read)

    async def _handle_later(self, batch: EventBatch) -> None:
        try:
            await self._handle(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to `_run`, which reconnects
            self._fail(exc)
            return
        finally:
            self._reading = None
        self._read()

    def _fail(self, exc: BaseException) -> None:
        if self._failed is not None and not self._failed.done():
            self._failed.set_exception(exc)

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """Resynchronise on every (re)connection to the publisher."""
        disconnected = False
        try:
            while True:
                event = parse_monitor_message(await monitor.recv_multipart())
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    disconnected = True
                elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    try:
                        await self.resync(reconnected=disconnected)
                    except zmq.ZMQError as exc:
                        log.warning("resync with %s failed: %s", self.engine, exc)
                    except Exception:  # a bug must not end this connection's resyncs
                        log.exception("resync with %s failed", self.engine)
                    disconnected = False
                    self.synced.set()
        except zmq.ZMQError:  # the monitor was closed under us: the socket is going away
            return

    async def resync(self, *, reconnected: bool = True) -> None:
        """Catch up after (re)connecting: what was published meanwhile, or a restart."""
        async with self._lock:
            expected = self._expected
            if self.replay_endpoint is None:
                if reconnected and expected is not None:
                    # batches may have gone by while we were away and nothing can replay them
                    self.stats.gaps_dropped += 1
                    self._clear()
                return
            if expected is not None and expected > 0:
                batches = await self._replay(expected - 1)
                if batches is None:
                    return  # no answer: the next message's sequence number will tell
                if batches and batches[0].seq == expected - 1 and batches[0].ts == self._last_ts:
                    self._apply_run(batches[1:], expected)  # same publisher: apply what we missed
                    return
                await self._rebuild_after_restart()
                return
            everything = await self._replay(0)
            if everything:  # all the buffer still holds (a long-lived engine's recent past)
                self._apply_run(everything, everything[0].seq)

    def _clear(self) -> None:
        """Drop the engine's entries (a restart, or events lost beyond replay)."""
        if not self._detached:
            self.index.clear_engine(self.engine)

    def _restarted(self) -> None:
        """A new publisher: the engine's cache is new, and its sequence starts again at 0."""
        self._clear()
        self._expected = 0
        self._last_ts = None
        self._recent.clear()

    def _apply_run(self, batches: list[EventBatch], first: int) -> None:
        """Apply consecutive batches from seq `first` (stopping at the first hole)."""
        for batch in batches:
            if batch.seq != first:
                break
            self._apply(batch)
            first += 1

    # --- one message -------------------------------------------------------------------------

    async def _handle(self, batch: EventBatch) -> None:
        """Apply one batch, recovering first from any gap it reveals."""
        async with self._lock:
            missing = self._first_missing(batch)
            if missing is None:
                return
            if missing < batch.seq:
                await self._recover(missing, batch.seq)
            self._apply(batch)

    def _handle_now(self, batch: EventBatch) -> bool:
        """`_handle` without waiting, for a batch that needs no replay first (nearly all);
        False for one that does: `_handle` then decides it again under the lock (a restart
        noted here is not noted twice: the sequence starts again at 0 by then)."""
        missing = self._first_missing(batch)
        if missing is not None and missing < batch.seq:
            return False
        if missing is not None:
            self._apply(batch)
        return True

    def _decode(self, frames: list[bytes]) -> EventBatch | None:
        try:
            return decode_message(frames)
        except EventDecodeError as exc:
            self.stats.decode_errors += 1
            log.warning("undecodable KV-event message from %s: %s", self.engine, exc)
            return None

    def _first_missing(self, batch: EventBatch) -> int | None:
        """The first sequence number still to apply before `batch` (its own when none is
        missing), noting a publisher's restart; None when `batch` was applied already or is
        older than what a replay gave."""
        expected = self._expected
        if self._recent.get(batch.seq) == batch.ts:
            return None  # already applied (it arrived live after a resync replayed it)
        if expected is not None and batch.seq < expected and batch.ts <= (self._last_ts or 0.0):
            return None  # older than what a replay already gave us: a stale, superseded message
        if expected is not None and batch.seq < expected:
            self.stats.publisher_restarts += 1
            log.info(
                "KV-event publisher of %s restarted (seq %d after %d); clearing its entries",
                self.engine,
                batch.seq,
                expected - 1,
            )
            self._restarted()
            expected = 0
        if expected is None:
            expected = 0 if self.replay_endpoint else batch.seq  # joined late: catch up if we can
        return expected

    def _apply(self, batch: EventBatch) -> None:
        if self._detached:
            return
        for event in batch.events:
            self.index.apply(self.engine, event)
        self.stats.batches += 1
        self.stats.events += batch.count
        self.stats.last_seq = batch.seq
        self.stats.lag_s = max(0.0, time.time() - batch.ts)
        self._expected = batch.seq + 1
        self._last_ts = batch.ts
        self._recent[batch.seq] = batch.ts
        if len(self._recent) > RECENT_BATCHES:
            del self._recent[next(iter(self._recent))]

    async def _recover(self, first_missing: int, upto: int) -> None:
        """Fill seq [first_missing, upto) from the replay socket, or drop the engine's entries.

        The replay starts one batch early, at the last one applied, to check that it is the
        same batch (as `resync` does): an engine that restarted unnoticed and whose new
        sequence has passed ours also looks like a gap, and its new batches applied on top of
        the old run's entries would leave those standing for blocks its empty cache lacks."""
        batches = None
        if self.replay_endpoint is not None:
            last = first_missing - 1
            batches = await self._replay(max(last, 0))
            if batches and last >= 0 and batches[0].seq == last and self._last_ts is not None:
                if batches[0].ts != self._last_ts:
                    await self._rebuild_after_restart(upto)
                    return
                batches = batches[1:]
        wanted = [b for b in batches or [] if first_missing <= b.seq < upto]
        complete = [b.seq for b in wanted] == list(range(first_missing, upto))
        if complete:
            self.stats.gaps_replayed += 1
        else:
            if first_missing > 0 or self._expected is not None:
                self.stats.gaps_dropped += 1
                log.warning(
                    "KV events %d..%d of %s lost and not replayable; rebuilding its entries",
                    first_missing,
                    upto - 1,
                    self.engine,
                )
                self._clear()
            # joining late with a partial buffer: use what there is
        for batch in wanted:
            self._apply(batch)

    async def _rebuild_after_restart(self, upto: int | None = None) -> None:
        """The publisher restarted: drop the engine's entries and apply the new run from the
        replay buffer, all it still holds (a long-lived engine's recent past), or up to `upto`
        (the live batch that revealed the restart, applied next)."""
        self.stats.publisher_restarts += 1
        log.info("KV-event publisher of %s restarted; rebuilding its entries", self.engine)
        self._restarted()
        everything = await self._replay(0)
        if everything:
            run = everything if upto is None else [b for b in everything if b.seq < upto]
            self._apply_run(run, everything[0].seq)

    async def _replay(self, start: int) -> list[EventBatch] | None:
        assert self.replay_endpoint is not None
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        batches: list[EventBatch] = []
        try:
            sock.connect(self.replay_endpoint)
            await sock.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
            for _ in range(MAX_REPLAY_BATCHES):
                # the timeout bounds the silence before each batch, not the whole replay: an
                # engine replays up to 10,000 steps, and a busy router decodes them slowly
                if not await sock.poll(self.replay_timeout_s * 1000):
                    log.warning("replay from %s timed out", self.replay_endpoint)
                    return None
                frames = await sock.recv_multipart()
                await asyncio.sleep(0)  # a turn for the requests, as the live reader gives
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) == 3 and int.from_bytes(frames[1], "big", signed=True) == END_SEQ:
                    return batches
                try:
                    batches.append(decode_message(frames))
                except EventDecodeError as exc:
                    self.stats.decode_errors += 1
                    log.warning("undecodable replayed batch from %s: %s", self.engine, exc)
            return batches
        finally:
            sock.close(linger=0)
