"""Physical KV blocks: ref counts, the free blocks, eviction, pins and the hash -> block prefix-cache map.

A free block (``ref_count == 0``) is in exactly one of three places, each an
O(1) structure threaded through the blocks (``jaxpaged.cache.blocks``):

* ``empty``: blocks that hold no cached content. Reused first, before any
  cached block is evicted; a block freed uncached goes to its head.
* ``policy``: cached blocks nobody holds, not pinned. The eviction policy
  (``jaxpaged.cache.eviction``; LRU by default) picks victims among them.
* ``pinned``: cached blocks nobody holds whose hash is pinned
  (``jaxpaged.cache.pins``); evicted, least recently freed first, only when
  the policy holds nothing.

A sequence releases its blocks deepest first, so every policy that keeps
arrival order among equals evicts the deepest of blocks freed together first,
and a parent is never evicted while a child released at the same time is
still resident.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from jaxpaged.cache.blocks import FreeBlockQueue, KVBlock
from jaxpaged.cache.eviction import EvictionPolicy, make_policy
from jaxpaged.cache.events import DEVICE_TIER, AllBlocksCleared, KVEventLog
from jaxpaged.cache.namespaces import Namespace, salt_in_namespace
from jaxpaged.cache.pins import PinTable
from jaxpaged.cache.residency import ResidencyTracker

__all__ = ["BlockPool", "EvictCallback", "FreeBlockQueue", "FreeBlocks", "KVBlock", "EVICTION_REASONS"]

# on_evict(block_id, block_hash, token_ids, parent_hash, cache_salt): a cached block is being reused;
# cache_salt is its chain's (the lower tiers keep it, so a tenant's reset finds its blocks there too)
EvictCallback = Callable[[int, bytes, tuple[int, ...], bytes | None, str | None], None]
# why a cached block lost its content: the policy's victim, a pinned block (nothing unpinned was
# left), or a prefix-cache reset
EVICTION_REASONS = ("capacity", "pinned", "reset")


class FreeBlocks:
    """Every free block, in the order the pool would reuse them: empty, then policy order, then pinned."""

    def __init__(self, pool: "BlockPool") -> None:
        self._pool = pool

    def __len__(self) -> int:
        pool = self._pool
        return len(pool.empty) + len(pool.policy) + len(pool.pinned)

    def __iter__(self) -> Iterator[KVBlock]:
        pool = self._pool
        yield from pool.empty
        yield from pool.policy
        yield from pool.pinned


class BlockPool:
    """Owns the physical blocks: ref counts, the free blocks, eviction and the prefix-cache map.

    A block is *used* when ``ref_count > 0`` and *free* otherwise; every free
    block is in ``empty``, ``policy`` or ``pinned`` (see the module docstring),
    whether or not it still holds cached content; ``free_queue`` iterates them all.
    """

    def __init__(self, num_blocks: int, *, eviction_policy: str | EvictionPolicy = "lru",
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``eviction_policy``: a name from ``EVICTION_POLICIES`` or a policy object; ``clock``:
        seconds, for pin deadlines and residency metrics."""
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.empty = FreeBlockQueue(self.blocks)
        for block in self.blocks:
            block.free_in = self.empty
        self.policy = make_policy(eviction_policy, num_blocks)
        self.pinned = FreeBlockQueue()
        self.pins = PinTable(clock)
        self.clock = clock
        self.free_queue = FreeBlocks(self)
        self.cached: dict[bytes, KVBlock] = {}
        self.num_used = 0
        self.num_evictions = 0
        self.evictions_by_reason = dict.fromkeys(EVICTION_REASONS, 0)
        self.residency: ResidencyTracker | None = None
        # Bumped whenever a hash entry disappears, so a PrefixMatch taken earlier
        # can tell in O(1) that none of its blocks can have been reassigned.
        self.cache_epoch = 0
        self._on_evict: EvictCallback | None = None
        self._events: KVEventLog | None = None
        # on_evict and the event log's hook, joined, so an eviction checks one attribute
        self._evict_hook: EvictCallback | None = None

    def track_residency(self, sample: float) -> ResidencyTracker:
        """Starts following one cached block in ``round(1 / sample)`` (see ``jaxpaged.cache.residency``)."""
        self.residency = ResidencyTracker(sample, self.clock)
        return self.residency

    @property
    def on_evict(self) -> EvictCallback | None:
        """Called as ``on_evict(block_id, block_hash, token_ids, parent_hash, cache_salt)`` when a cached block
        is reused."""
        return self._on_evict

    @on_evict.setter
    def on_evict(self, callback: EvictCallback | None) -> None:
        self._on_evict = callback
        self._join_evict_hooks()

    @property
    def events(self) -> KVEventLog | None:
        """The log that records prefix-cache events, or None (no event work at all)."""
        return self._events

    @events.setter
    def events(self, log: KVEventLog | None) -> None:
        self._events = log
        self._join_evict_hooks()

    def _join_evict_hooks(self) -> None:
        removed = self._events.removed if self._events is not None else None
        hooks = [hook for hook in (removed, self._on_evict) if hook is not None]
        if len(hooks) < 2:
            self._evict_hook = hooks[0] if hooks else None
            return
        first, second = hooks

        def both(block_id: int, block_hash: bytes, token_ids: tuple[int, ...], parent_hash: bytes | None,
                 cache_salt: str | None) -> None:
            first(block_id, block_hash, token_ids, parent_hash, cache_salt)
            second(block_id, block_hash, token_ids, parent_hash, cache_salt)

        self._evict_hook = both

    @property
    def num_free(self) -> int:
        """Free blocks, cached-evictable and pinned ones included."""
        return len(self.empty) + len(self.policy) + len(self.pinned)

    @property
    def num_pinned_blocks(self) -> int:
        """Free cached blocks a pin keeps from the eviction policy (O(1))."""
        return len(self.pinned)

    def allocate(self, count: int) -> list[KVBlock]:
        """Takes ``count`` free blocks: empty ones first, then the policy's victims, then pinned ones.

        The caller must have checked ``count <= num_free``.
        """
        empty = self.empty
        from_empty = min(count, len(empty))
        taken = empty.popleft_many(from_empty)
        if count > from_empty:
            if self.pins.deadlines:
                self._expire_pins()
            policy, pinned = self.policy, self.pinned
            for _ in range(count - from_empty):
                if len(policy):
                    block = policy.pop()
                    self._evict(block, "capacity")
                else:
                    block = pinned.popleft()
                    self._evict(block, "pinned")
                taken.append(block)
        for block in taken:
            block.free_in = None
            block.ref_count = 1
        self.num_used += count
        return taken

    def _evict(self, block: KVBlock, reason: str) -> None:
        block_hash, token_ids, parent_hash, cache_salt = block.block_hash, block.token_ids, block.parent_hash, \
            block.cache_salt
        if block.sampled:
            self.residency.evicted(block)
        del self.cached[block_hash]
        block.clear_hash()
        self.num_evictions += 1
        self.evictions_by_reason[reason] += 1
        self.cache_epoch += 1
        if self._evict_hook is not None:
            self._evict_hook(block.block_id, block_hash, token_ids, parent_hash, cache_salt)

    def take(self, blocks: Sequence[KVBlock]) -> None:
        """Adds one reference to each block; a free one leaves its list (a "touch"), a cached one counts a hit."""
        revived = 0
        for block in blocks:
            if block.ref_count == 0:
                home = block.free_in
                if home.__class__ is FreeBlockQueue:  # FreeBlockQueue.remove, inlined: the cost of a hit
                    prev, nxt = block.prev_free, block.next_free
                    prev.next_free = nxt
                    nxt.prev_free = prev
                    block.prev_free = block.next_free = None
                    home._len -= 1  # same package: the queue's friend
                else:
                    home.remove(block)
                block.free_in = None
                revived += 1
            if block.block_hash is not None:
                block.hits += 1
                if block.sampled:
                    self.residency.referenced(block)
            block.ref_count += 1
        self.num_used += revived

    def release(self, blocks: Sequence[KVBlock]) -> None:
        """Drops one reference from each block, in the order given.

        A block reaching zero becomes free: at the head of ``empty`` if it holds
        nothing, in the pinned list if its hash is pinned, else with the policy.
        """
        empty, policy, pins, home = self.empty, self.policy, self.pins, self.policy.home
        for block in blocks:
            block.ref_count -= 1
            if block.ref_count == 0:
                self.num_used -= 1
                if block.block_hash is None:
                    empty.appendleft(block)
                    block.free_in = empty
                    continue
                if block.sampled:
                    self.residency.freed(block)
                if pins.deadlines and block.block_hash in pins:
                    self.pinned.append(block)
                    block.free_in = self.pinned
                else:
                    policy.add(block)
                    block.free_in = home

    def pin(self, hashes: Sequence[bytes], ttl_s: float) -> int:
        """Pins these block hashes for ``ttl_s`` seconds (``<= 0``: unpins them); returns how many are cached.

        A free cached block moves between the policy and the pinned list now;
        the others follow when their last reference is dropped.
        """
        if self.pins.deadlines:
            self._expire_pins()  # so deadlines of pins nobody evicts under do not pile up
        for block_hash in self.pins.pin(hashes, ttl_s):
            self._unpin(block_hash)
        cached = [self.cached[h] for h in hashes if h in self.cached]
        if ttl_s > 0:
            for block in cached:
                if block.free_in is self.policy.home:
                    self.policy.remove(block)
                    self.pinned.append(block)
                    block.free_in = self.pinned
        return len(cached)

    def _unpin(self, block_hash: bytes) -> None:
        block = self.cached.get(block_hash)
        if block is not None and block.free_in is self.pinned:
            self.pinned.remove(block)
            self.policy.add(block)
            block.free_in = self.policy.home

    def _expire_pins(self) -> None:
        for block_hash in self.pins.expired():
            self._unpin(block_hash)

    def cache_block(
        self,
        block: KVBlock,
        block_hash: bytes,
        parent_hash: bytes | None,
        token_ids: tuple[int, ...],
        extra_keys: tuple,
        cache_salt: str | None = None,
    ) -> bool:
        """Publishes a computed full block under ``block_hash``; ``cache_salt`` is its chain's salt.

        If another block is already cached under that hash, the existing entry is
        kept and ``block`` stays private (returns False).
        """
        if block_hash in self.cached:
            return False
        self.cached[block_hash] = block
        block.block_hash = block_hash
        block.parent_hash = parent_hash
        block.token_ids = token_ids
        block.extra_keys = extra_keys
        block.cache_salt = cache_salt
        if self.residency is not None:
            self.residency.cached(block)
        return True

    def reset_namespace(self, namespace: Namespace) -> int:
        """Drops the hash entry of every free cached block whose salt is in ``namespace``
        (``jaxpaged.cache.namespaces``), pinned ones included (their pins stay); blocks in use keep theirs.
        Other namespaces' blocks are untouched. Returns how many entries were dropped.

        The dropped blocks go to ``empty`` without passing through ``on_evict``
        (a reset is not an eviction: nothing is offloaded); the event log hears
        of each as removed."""
        doomed = [block for block in self.cached.values()
                  if block.ref_count == 0 and salt_in_namespace(block.cache_salt, namespace)]
        for block in doomed:
            (self.pinned if block.free_in is self.pinned else self.policy).remove(block)
            if block.sampled:
                self.residency.dropped(block)
            del self.cached[block.block_hash]
            if self._events is not None:
                self._events.remove(block.block_hash, DEVICE_TIER)
            block.clear_hash()
            self.empty.append(block)
            block.free_in = self.empty
        if doomed:
            self.evictions_by_reason["reset"] += len(doomed)
            self.cache_epoch += 1
        return len(doomed)

    def reset_cache(self) -> bool:
        """Drops every hash entry (pins stay); refused (False) while any block is in use."""
        if self.num_used > 0:
            return False
        for queue in (self.policy, self.pinned):
            while len(queue):
                block = queue.pop() if queue is self.policy else queue.popleft()
                if block.sampled:
                    self.residency.dropped(block)
                block.clear_hash()
                self.empty.append(block)
                block.free_in = self.empty
        self.evictions_by_reason["reset"] += len(self.cached)
        self.cached.clear()
        self.cache_epoch += 1
        if self._events is not None:
            self._events.append(AllBlocksCleared())
        return True
