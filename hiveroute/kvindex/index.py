"""The global index: which engine holds which KV block, and on which tier.

Keys are the router's own chained block keys (`blocks.block_keys`), so blocks are comparable
across engines whatever their hash seeds. Each engine's own hashes map to keys, which is how a
`BlockRemoved` (that carries only engine hashes) finds its block. Memory is bounded: past
`max_blocks` keys the least recently used key is forgotten everywhere.

Speculative entries: when a request is routed to an engine, its blocks count as cached there
until that engine's events confirm them or `speculative_ttl_s` passes, so a burst of sibling
requests follows the first one instead of scattering before its first event arrives. The
approximate `prefix` policy uses an index of its own in which every entry is speculative (no
events), refreshed by each routing decision.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice, takewhile

from hiveroute.kvindex.blocks import BlockKey, block_keys
from hiveroute.kvindex.events import (
    GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineHash,
    KvEvent,
)

DEFAULT_MAX_BLOCKS = 500_000
DEFAULT_SPECULATIVE_TTL_S = 5.0
MAX_MATCH_MEMO = 4096  # remembered prefix matches (engine, last shared block)


@dataclass(frozen=True)
class PrefixMatch:
    """How much of a request's prefix one engine holds, in blocks of that engine's size."""

    block_size: int
    gpu_blocks: int = 0  # on the GPU tier (or speculatively there)
    lower_blocks: int = 0  # only on a lower tier (CPU, disk): cached, but must be loaded back
    speculative_blocks: int = 0  # of gpu_blocks, those only predicted, not yet confirmed

    @property
    def blocks(self) -> int:
        return self.gpu_blocks + self.lower_blocks

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size

    @property
    def gpu_tokens(self) -> int:
        return self.gpu_blocks * self.block_size

    @property
    def lower_tokens(self) -> int:
        return self.lower_blocks * self.block_size


@dataclass(frozen=True, slots=True)
class _Walked:
    """What an engine holds of a run of keys; remembered for a whole shared prefix while the
    engine's version is unchanged (nothing it held has gone or changed tier since) and its
    speculation lasts (`valid_until`)."""

    gpu: int
    lower: int
    spec: int
    valid_until: float  # the earliest expiry of the speculative blocks it counted
    whole: bool  # it held every key of the run


class _Block:
    __slots__ = ("holders", "spec")

    def __init__(self) -> None:
        self.holders: dict[str, dict[str, EngineHash]] = {}  # engine -> medium -> engine hash
        self.spec: dict[str, float] = {}  # engine -> expiry (monotonic seconds)


class _Engine:
    __slots__ = ("block_size", "by_hash", "evicted", "gpu_keys", "most_held", "orphans", "pending")

    def __init__(self) -> None:
        self.block_size: int | None = None
        self.by_hash: dict[EngineHash, BlockKey] = {}
        # keys its events confirmed on the GPU: a prompt's prefix is checked against it in one
        # C-level pass instead of a Python step per block
        self.gpu_keys: set[BlockKey] = set()
        self.orphans = 0  # stored blocks whose parent we did not know (chain cannot be computed)
        self.most_held = 0  # the most GPU blocks it held at once
        self.evicted = False  # it has removed a GPU block: its cache has filled up once
        # requests routed before the engine's first event told us its block size
        self.pending: deque[tuple[float, Sequence[int], str | None]] = deque(maxlen=256)


class KvIndex:
    """Block key → engines (with tier), and engine hash → key per engine."""

    def __init__(
        self,
        *,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        speculative_ttl_s: float = DEFAULT_SPECULATIVE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_blocks <= 0:
            raise ValueError("max_blocks must be positive")
        if speculative_ttl_s < 0:
            raise ValueError("speculative_ttl_s must be 0 or more")
        self.max_blocks = max_blocks
        self.speculative_ttl_s = speculative_ttl_s
        self.clock = clock
        self.evictions = 0
        self._blocks: OrderedDict[BlockKey, _Block] = OrderedDict()
        self._engines: dict[str, _Engine] = {}
        self._expiries: deque[tuple[float, BlockKey, str]] = deque()
        # Matching a prompt's shared prefix once per prefix, not once per request: an engine's
        # version changes whenever it may hold less of a prefix than before (a block removed,
        # cleared, forgotten or expired, a tier changed); adding blocks cannot undo a match.
        self._versions: dict[str, int] = {}
        # (engine, last shared block) -> (the engine's version then, what it held of the prefix)
        self._matched: dict[tuple[str, BlockKey], tuple[int, _Walked]] = {}
        # engine -> how many times it may have lost blocks (removed, cleared, forgotten)
        self._losses: dict[str, int] = {}
        # (engine, last shared block) -> (the engine's losses, when) a prompt's blocks up to it
        # were last speculated or confirmed there, all of them
        self._refreshed: dict[tuple[str, BlockKey], tuple[int, float]] = {}
        # engine -> when the index's cap last evicted a block speculated there: a prefix
        # speculated before then may have lost its head (the oldest blocks go first)
        self._speculation_evicted_at: dict[str, float] = {}
        self.match_memo_hits = 0

    # --- sizes and engines -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._blocks)

    def engines(self) -> list[str]:
        return list(self._engines)

    def block_size(self, engine: str) -> int | None:
        state = self._engines.get(engine)
        return state.block_size if state else None

    def set_block_size(self, engine: str, block_size: int) -> None:
        """Record an engine's block size; a change (a restart with new settings) clears it."""
        state = self._engine(engine)
        if state.block_size == block_size:
            return
        if state.block_size is not None:
            self.clear_engine(engine)
        state.block_size = block_size
        now = self.clock()
        while state.pending:
            expiry, tokens, salt = state.pending.popleft()
            if expiry > now:
                keys = block_keys(tokens, block_size, salt=salt)
                self.add_speculative(engine, keys, ttl_s=expiry - now)

    def engine_hashes(self, engine: str) -> set[EngineHash]:
        """The engine's own hashes of every block the index believes it holds (any tier)."""
        state = self._engines.get(engine)
        return set(state.by_hash) if state else set()

    def engine_block_count(self, engine: str) -> int:
        state = self._engines.get(engine)
        return len(state.by_hash) if state else 0

    def orphans(self, engine: str) -> int:
        state = self._engines.get(engine)
        return state.orphans if state else 0

    def capacity_blocks(self, engine: str) -> int | None:
        """How many blocks the engine's cache holds, as its events show: the most it held at
        once, once it has had to evict; None while it never has (it still has free room)."""
        state = self._engines.get(engine)
        if state is None or not state.evicted:
            return None
        return max(1, state.most_held)

    def _engine(self, engine: str) -> _Engine:
        state = self._engines.get(engine)
        if state is None:
            state = self._engines[engine] = _Engine()
        return state

    # --- events ------------------------------------------------------------------------------

    def apply(self, engine: str, event: KvEvent) -> None:
        if isinstance(event, BlockStored):
            self.block_stored(engine, event)
        elif isinstance(event, BlockRemoved):
            self.block_removed(engine, event.block_hashes, event.medium)
        elif isinstance(event, AllBlocksCleared):
            self.clear_engine(engine)

    def block_stored(self, engine: str, event: BlockStored) -> list[BlockKey]:
        """Record blocks an engine stored; returns their keys (empty if the chain is unknown)."""
        self.set_block_size(engine, event.block_size)
        state = self._engines[engine]
        parent: int | None = None
        if event.parent_block_hash is not None:
            parent = state.by_hash.get(event.parent_block_hash)
            if parent is None:
                state.orphans += len(event.block_hashes)
                return []
        count = min(len(event.block_hashes), len(event.token_ids) // event.block_size)
        tokens = event.token_ids[: count * event.block_size]
        keys = block_keys(tokens, event.block_size, salt=event.cache_salt, parent=parent)
        # one step per block of every prefill in the fleet: names bound once; a block stored
        # again moves to the LRU end
        medium = event.medium
        blocks, by_hash = self._blocks, state.by_hash
        changed = False
        for engine_hash, key in zip(event.block_hashes, keys, strict=False):
            entry = blocks.get(key)
            if entry is None:
                entry = blocks[key] = _Block()
            else:
                blocks.move_to_end(key)
            tiers = entry.holders.get(engine)
            if tiers is None:
                tiers = entry.holders[engine] = {}
            elif medium not in tiers:
                changed = True  # another tier now: a match's split changes
            tiers[medium] = engine_hash
            if entry.spec and entry.spec.pop(engine, None) is not None:
                changed = True  # confirmed: no longer counted as speculative
            by_hash[engine_hash] = key
        if changed:
            self._changed(engine)
        if medium == GPU:
            state.gpu_keys.update(keys)  # one per stored hash: count <= len(block_hashes)
            state.most_held = max(state.most_held, len(state.gpu_keys))
        self._enforce_cap()
        return keys

    def block_removed(
        self, engine: str, hashes: Iterable[EngineHash], medium: str | None = GPU
    ) -> None:
        state = self._engines.get(engine)
        if state is None:
            return
        medium = medium or GPU
        self._changed(engine)
        self._lost(engine)
        gpu = medium == GPU
        blocks, by_hash, gpu_keys = self._blocks, state.by_hash, state.gpu_keys
        for engine_hash in hashes:
            key = by_hash.get(engine_hash)
            if key is None:
                continue
            entry = blocks.get(key)
            if gpu:
                gpu_keys.discard(key)
                state.evicted = True  # even when a lower tier keeps a copy
            if entry is not None:
                tiers = entry.holders.get(engine)
                if tiers is not None:
                    tiers.pop(medium, None)
                    if tiers:
                        continue  # still held on another tier
                    del entry.holders[engine]
                    if not entry.holders and not entry.spec:
                        del blocks[key]
            del by_hash[engine_hash]

    def clear_engine(self, engine: str) -> None:
        """Forget everything an engine holds (AllBlocksCleared, a restart, or lost events)."""
        state = self._engines.get(engine)
        if state is None:
            return
        self._changed(engine)
        self._lost(engine)
        for key in set(state.by_hash.values()):
            entry = self._blocks.get(key)
            if entry is not None and entry.holders.pop(engine, None) is not None:
                self._drop_if_empty(key, entry)
        state.by_hash.clear()
        state.gpu_keys.clear()
        for key, entry in list(self._blocks.items()):
            if entry.spec.pop(engine, None) is not None:
                self._drop_if_empty(key, entry)

    def remove_engine(self, engine: str) -> None:
        """The engine left the pool: nothing of it stays (a pool that churns would grow the
        per-engine records for good), its memo entries neither, so a version counted again
        from 0 under its name cannot match one of them."""
        self.clear_engine(engine)
        self._engines.pop(engine, None)
        self._versions.pop(engine, None)
        self._losses.pop(engine, None)
        self._speculation_evicted_at.pop(engine, None)
        for memo in (self._matched, self._refreshed):
            for key in [k for k in memo if k[0] == engine]:
                del memo[key]

    # --- speculation -------------------------------------------------------------------------

    def add_speculative(
        self,
        engine: str,
        keys: Sequence[BlockKey],
        *,
        ttl_s: float | None = None,
        shared_blocks: int = 0,
    ) -> None:
        """Count `keys` as cached on `engine` until events confirm them or the TTL passes.

        `shared_blocks`: how many leading keys this prompt shares with one tokenized before
        (the prefix cache knows). When the last of them was speculated on `engine` less than
        half a TTL ago, so were all before it (speculation always covers a prompt from its
        start): only the rest are speculated again. A workflow resends its long context with
        every request; it is speculated once per half TTL, not once per request."""
        ttl = self.speculative_ttl_s if ttl_s is None else ttl_s
        if ttl <= 0 or not keys:
            return
        now = self.clock()
        expiry = now + ttl
        self._sweep(now)
        blocks, queue = self._blocks, self._expiries
        move_to_end = blocks.move_to_end
        start = 0
        if 0 < shared_blocks <= len(keys) and self._fresh(engine, keys, shared_blocks, now, ttl):
            start = shared_blocks
        whole = start == 0  # every key is refreshed, the shared ones too
        # its events confirmed these already: they only move up the index's LRU order, in
        # C-level passes (a conversation's history is most of each of its prompts)
        n_confirmed = self._confirmed_run(engine, keys, start, len(keys))
        deque(map(move_to_end, islice(keys, start, start + n_confirmed)), maxlen=0)
        start += n_confirmed
        # Agents resend long shared prefixes: most keys are here already, speculated on this
        # engine by a sibling. Those only get a later expiry; their record in the queue (the
        # sweep re-queues a record whose block was refreshed) stays, so a shared block costs
        # one queue record per TTL, not one per request.
        for key in islice(keys, start, None):
            entry = blocks.get(key)
            if entry is None:
                entry = blocks[key] = _Block()
            else:
                move_to_end(key)
            held = entry.holders.get(engine)
            if held is not None and GPU in held:
                continue  # confirmed already
            if held:
                self._changed(engine)  # held on a lower tier only: now counted on the GPU
            previous = entry.spec.get(engine)
            entry.spec[engine] = expiry
            if previous is None or previous <= now:
                queue.append((expiry, key, engine))
        if whole and shared_blocks > 0:
            if len(self._refreshed) >= MAX_MATCH_MEMO:
                self._refreshed.clear()
            losses = self._losses.get(engine, 0)
            self._refreshed[(engine, keys[shared_blocks - 1])] = (losses, now)
        self._enforce_cap()

    def _fresh(
        self, engine: str, keys: Sequence[BlockKey], shared: int, now: float, ttl: float
    ) -> bool:
        """Whether keys[:shared] were all speculated or confirmed on `engine` less than half a
        TTL ago: the last of them was speculated then, and since then the index's cap evicted
        none of the engine's speculation (speculation covers a prompt from its start; the cap
        takes the oldest, its head, first), or a prompt that ended its shared part there was
        refreshed whole then and the engine has lost no block since."""
        boundary_key = keys[shared - 1]
        boundary = self._blocks.get(boundary_key)
        if boundary is None:
            return False
        expiry = boundary.spec.get(engine, 0.0)
        evicted_at = self._speculation_evicted_at.get(engine, -math.inf)
        if expiry - now > ttl / 2 and expiry - ttl > evicted_at:
            return True
        found = self._refreshed.get((engine, boundary_key))
        return (
            found is not None
            and found[0] == self._losses.get(engine, 0)
            and now - found[1] < ttl / 2
        )

    def add_speculative_tokens(
        self,
        engine: str,
        token_ids: Sequence[int],
        *,
        salt: str | None = None,
        ttl_s: float | None = None,
    ) -> None:
        """`add_speculative` by token ids; before the engine's block size is known (no event
        yet) the request waits, so the very first request's blocks still count."""
        ttl = self.speculative_ttl_s if ttl_s is None else ttl_s
        state = self._engine(engine)
        if state.block_size is None:
            if ttl > 0:
                state.pending.append((self.clock() + ttl, token_ids, salt))
            return
        keys = block_keys(token_ids, state.block_size, salt=salt)
        self.add_speculative(engine, keys, ttl_s=ttl)

    def _sweep(self, now: float) -> None:
        limit = 4 * self.max_blocks
        queue = self._expiries
        while queue and (queue[0][0] <= now or len(queue) > limit):
            due, key, engine = queue.popleft()
            entry = self._blocks.get(key)
            if entry is None:
                continue
            expiry = entry.spec.get(engine)
            if expiry is None:
                continue
            if expiry > now and due <= now:  # refreshed since: follow it to its new expiry
                queue.append((expiry, key, engine))
            elif expiry <= now or due > now:  # expired, or over the queue's bound: forget it
                del entry.spec[engine]
                self._changed(engine)
                self._drop_if_empty(key, entry)

    # --- queries -----------------------------------------------------------------------------

    def match(
        self, engine: str, keys: Sequence[BlockKey], block_size: int, *, shared_blocks: int = 0
    ) -> PrefixMatch:
        """The longest prefix of `keys` the engine holds, split by tier. (A lookup does not
        refresh a block's place in the index's LRU order: the engine's events and the router's
        speculation do, for the blocks actually used.)

        `shared_blocks`: how many leading keys this prompt shares with one tokenized before.
        When the engine was found to hold all of those, and holds no less since, they are not
        walked again: a workflow's context is matched once, each request's tail every time."""
        now = self.clock()
        n = shared_blocks if 0 < shared_blocks <= len(keys) else 0
        head = self._shared_head(engine, keys, n, now) if n else None
        if head is not None and not head.whole:
            return PrefixMatch(block_size, head.gpu, head.lower, head.spec)
        rest = self._walk(engine, keys, n, len(keys), now)
        if head is None:
            return PrefixMatch(block_size, rest.gpu, rest.lower, rest.spec)
        return PrefixMatch(
            block_size, head.gpu + rest.gpu, head.lower + rest.lower, head.spec + rest.spec
        )

    def _shared_head(self, engine: str, keys: Sequence[BlockKey], n: int, now: float) -> _Walked:
        """What the engine holds of keys[:n], remembered while it holds no less."""
        memo_key = (engine, keys[n - 1])
        version = self._versions.get(engine, 0)
        found = self._matched.get(memo_key)
        if found is not None and found[0] == version and now < found[1].valid_until:
            self.match_memo_hits += 1
            return found[1]
        head = self._walk(engine, keys, 0, n, now)
        if head.whole:
            if len(self._matched) >= MAX_MATCH_MEMO:
                self._matched.clear()
            self._matched[memo_key] = (version, head)
        return head

    def _walk(
        self, engine: str, keys: Sequence[BlockKey], start: int, stop: int, now: float
    ) -> _Walked:
        """keys[start:stop] in order while the engine holds each (on any tier, or
        speculatively); whether it held them all. The leading blocks its events confirmed on
        the GPU (a conversation's or a workflow's history, usually all but the new tail) are
        counted at C speed; only the rest is stepped through."""
        gpu = self._confirmed_run(engine, keys, start, stop)
        lower = spec = 0
        valid_until = math.inf
        if gpu == stop - start:
            return _Walked(gpu, lower, spec, valid_until, whole=True)
        get = self._blocks.get
        for key in islice(keys, start + gpu, stop):
            entry = get(key)
            if entry is None:
                return _Walked(gpu, lower, spec, valid_until, whole=False)
            tiers = entry.holders.get(engine)
            if tiers is not None and GPU in tiers:
                gpu += 1
                continue
            expiry = entry.spec.get(engine, 0.0)
            if expiry > now:
                gpu += 1
                spec += 1
                valid_until = min(valid_until, expiry)
            elif tiers:
                lower += 1
            else:
                return _Walked(gpu, lower, spec, valid_until, whole=False)
        return _Walked(gpu, lower, spec, valid_until, whole=True)

    def _confirmed_run(self, engine: str, keys: Sequence[BlockKey], start: int, stop: int) -> int:
        """How many of keys[start:stop], from the first, the engine's events confirmed on its
        GPU: counted at C speed, stopping at the first it lacks."""
        state = self._engines.get(engine)
        if state is None or not state.gpu_keys:
            return 0
        return len(list(takewhile(state.gpu_keys.__contains__, islice(keys, start, stop))))

    def _changed(self, engine: str) -> None:
        """The engine may hold less of some prefix than a remembered match says."""
        self._versions[engine] = self._versions.get(engine, 0) + 1

    def _lost(self, engine: str) -> None:
        """The engine may have lost blocks a remembered refresh covered."""
        self._losses[engine] = self._losses.get(engine, 0) + 1

    def match_tokens(
        self, engine: str, token_ids: Sequence[int], *, salt: str | None = None
    ) -> PrefixMatch:
        """`match` for raw token ids, chained with the engine's block size."""
        size = self.block_size(engine)
        if size is None:
            return PrefixMatch(block_size=1)
        return self.match(engine, block_keys(token_ids, size, salt=salt), size)

    def holders(self, key: BlockKey) -> dict[str, set[str]]:
        """Engine → tiers holding `key` (confirmed only)."""
        entry = self._blocks.get(key)
        if entry is None:
            return {}
        return {engine: set(tiers) for engine, tiers in entry.holders.items()}

    # --- internals ---------------------------------------------------------------------------

    def _drop_if_empty(self, key: BlockKey, entry: _Block) -> None:
        if not entry.holders and not entry.spec:
            self._blocks.pop(key, None)

    def _enforce_cap(self) -> None:
        while len(self._blocks) > self.max_blocks:
            key, entry = self._blocks.popitem(last=False)
            self.evictions += 1
            for engine in (*entry.holders, *entry.spec):
                self._changed(engine)
                self._lost(engine)
            if entry.spec:
                evicted_at = self.clock()
                for engine in entry.spec:
                    self._speculation_evicted_at[engine] = evicted_at
            for engine, tiers in entry.holders.items():
                state = self._engines.get(engine)
                if state is not None:
                    state.gpu_keys.discard(key)
                    for engine_hash in tiers.values():
                        state.by_hash.pop(engine_hash, None)
