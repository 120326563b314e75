"""Physical KV blocks, their O(1) free queue, and the hash -> block prefix-cache map.

The free queue is a doubly linked list threaded through the :class:`KVBlock`
objects themselves (``prev_free`` / ``next_free``), with two sentinel nodes.
Popping blocks off the head, appending at either end and unlinking a block
from the middle (a prefix-cache hit reviving an evictable block) are O(1)
pointer updates per block; no list is searched or shifted.

Queue order is the eviction order. Blocks that hold no cached content are put at
the head, so they are reused before any cached block is evicted; cached blocks
whose last reference is dropped join the tail, so the head of the cached part is
the least recently used. A sequence releases its blocks deepest first, which
puts its deepest block nearest the head: among blocks freed together the one
with the longest prefix is evicted first, and a parent is never evicted while a
child released at the same time is still resident.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from jaxpaged.cache.events import AllBlocksCleared, KVEventLog

# on_evict(block_id, block_hash, token_ids, parent_hash): a cached block is being reused
EvictCallback = Callable[[int, bytes, tuple[int, ...], bytes | None], None]


class KVBlock:
    """One physical block of the device KV pool, as the host sees it.

    ``block_hash`` is set only while the prefix-cache map points at this block;
    ``parent_hash``, ``token_ids`` and ``extra_keys`` are the hash's inputs, kept
    so the hash can be re-derived (invariant checks) and handed to ``on_evict``.
    """

    __slots__ = (
        "block_id",
        "ref_count",
        "block_hash",
        "parent_hash",
        "token_ids",
        "extra_keys",
        "prev_free",
        "next_free",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: bytes | None = None
        self.parent_hash: bytes | None = None
        self.token_ids: tuple[int, ...] = ()
        self.extra_keys: tuple = ()
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None

    def clear_hash(self) -> None:
        """Forgets the cached content (the block's data is now meaningless)."""
        self.block_hash = None
        self.parent_hash = None
        self.token_ids = ()
        self.extra_keys = ()

    def __repr__(self) -> str:
        return f"KVBlock(id={self.block_id}, ref={self.ref_count}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Doubly linked list of free blocks; every operation is O(1) per block it moves."""

    def __init__(self, blocks: Sequence[KVBlock]) -> None:
        self._head = KVBlock(-1)  # sentinels: never handed out
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[KVBlock]:
        """Blocks from head (next to be reused) to tail."""
        node = self._head.next_free
        while node is not self._tail:
            yield node
            node = node.next_free

    def _link(self, block: KVBlock, prev: KVBlock, nxt: KVBlock) -> None:
        block.prev_free = prev
        block.next_free = nxt
        prev.next_free = block
        nxt.prev_free = block
        self._len += 1

    def append(self, block: KVBlock) -> None:
        """Adds ``block`` at the tail (reused last)."""
        self._link(block, self._tail.prev_free, self._tail)

    def appendleft(self, block: KVBlock) -> None:
        """Adds ``block`` at the head (reused first)."""
        self._link(block, self._head, self._head.next_free)

    def remove(self, block: KVBlock) -> None:
        """Unlinks ``block``, which must be in the queue."""
        prev, nxt = block.prev_free, block.next_free
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def popleft_many(self, count: int) -> list[KVBlock]:
        """Removes and returns the ``count`` head blocks in queue order: O(count), one relink."""
        if not 0 <= count <= self._len:
            raise IndexError(f"cannot pop {count} blocks from a FreeBlockQueue of {self._len}")
        taken = []
        node = self._head.next_free
        for _ in range(count):
            taken.append(node)
            nxt = node.next_free
            node.prev_free = node.next_free = None
            node = nxt
        self._head.next_free = node
        node.prev_free = self._head
        self._len -= count
        return taken


class BlockPool:
    """Owns the physical blocks: ref counts, the free queue and the prefix-cache map.

    A block is *used* when ``ref_count > 0`` and *free* otherwise; every free
    block is in the free queue, whether or not it still holds cached content.
    """

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, KVBlock] = {}
        self.num_used = 0
        self.num_evictions = 0
        # Bumped whenever a hash entry disappears, so a PrefixMatch taken earlier
        # can tell in O(1) that none of its blocks can have been reassigned.
        self.cache_epoch = 0
        self._on_evict: EvictCallback | None = None
        self._events: KVEventLog | None = None
        # on_evict and the event log's hook, joined, so an eviction checks one attribute
        self._evict_hook: EvictCallback | None = None

    @property
    def on_evict(self) -> EvictCallback | None:
        """Called as ``on_evict(block_id, block_hash, token_ids, parent_hash)`` when a cached block is reused."""
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

        def both(block_id: int, block_hash: bytes, token_ids: tuple[int, ...], parent_hash: bytes | None) -> None:
            first(block_id, block_hash, token_ids, parent_hash)
            second(block_id, block_hash, token_ids, parent_hash)

        self._evict_hook = both

    @property
    def num_free(self) -> int:
        """Free blocks, cached-evictable ones included."""
        return len(self.free_queue)

    def allocate(self, count: int) -> list[KVBlock]:
        """Takes ``count`` blocks from the head of the free queue, evicting cached ones.

        The caller must have checked ``count <= num_free``.
        """
        taken = self.free_queue.popleft_many(count)
        for block in taken:
            if block.block_hash is not None:
                self._evict(block)
            block.ref_count = 1
        self.num_used += count
        return taken

    def _evict(self, block: KVBlock) -> None:
        block_hash, token_ids, parent_hash = block.block_hash, block.token_ids, block.parent_hash
        del self.cached[block_hash]
        block.clear_hash()
        self.num_evictions += 1
        self.cache_epoch += 1
        if self._evict_hook is not None:
            self._evict_hook(block.block_id, block_hash, token_ids, parent_hash)

    def take(self, blocks: Sequence[KVBlock]) -> None:
        """Adds one reference to each block; a free one leaves the free queue (a "touch")."""
        revived = 0
        for block in blocks:
            if block.ref_count == 0:
                # FreeBlockQueue.remove, inlined: this loop is the cost of a cache hit.
                prev, nxt = block.prev_free, block.next_free
                prev.next_free = nxt
                nxt.prev_free = prev
                block.prev_free = block.next_free = None
                revived += 1
            block.ref_count += 1
        self.free_queue._len -= revived  # same module: the queue's friend
        self.num_used += revived

    def release(self, blocks: Sequence[KVBlock]) -> None:
        """Drops one reference from each block, in the order given.

        A block reaching zero becomes free: at the tail if it is cached (evictable,
        least recently used first), at the head if not (nothing to keep).
        """
        queue = self.free_queue
        for block in blocks:
            block.ref_count -= 1
            if block.ref_count == 0:
                self.num_used -= 1
                if block.block_hash is None:
                    queue.appendleft(block)
                else:
                    queue.append(block)

    def cache_block(
        self,
        block: KVBlock,
        block_hash: bytes,
        parent_hash: bytes | None,
        token_ids: tuple[int, ...],
        extra_keys: tuple,
    ) -> bool:
        """Publishes a computed full block under ``block_hash``.

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
        return True

    def reset_cache(self) -> bool:
        """Drops every hash entry; refused (False) while any block is in use."""
        if self.num_used > 0:
            return False
        for block in self.cached.values():
            block.clear_hash()
        self.cached.clear()
        self.cache_epoch += 1
        if self._events is not None:
            self._events.append(AllBlocksCleared())
        return True
