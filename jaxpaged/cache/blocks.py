"""The host's view of one physical KV block, and the O(1) doubly linked list threaded through blocks.

``FreeBlockQueue`` links blocks through their own ``prev_free`` / ``next_free``
fields between two sentinels: appending at either end, popping the head and
unlinking a block from the middle are O(1) pointer updates per block. A block
sits in at most one such list at a time, so the pool's list of uncached free
blocks and every eviction policy's lists share the two fields.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence


class KVBlock:
    """One physical block of the device KV pool, as the host sees it.

    ``block_hash`` is set only while the prefix-cache map points at this block;
    ``parent_hash``, ``token_ids`` and ``extra_keys`` are the hash's inputs, kept
    so the hash can be re-derived (invariant checks) and handed to ``on_evict``;
    ``cache_salt`` is the salt of the request whose chain the block is in (every
    block of the chain, not only block 0), so a reset can be scoped to a namespace.
    ``hits`` counts the references taken on the block since it was cached
    (prefix hits and forks); ``policy_state`` belongs to the eviction policy;
    ``free_in`` is the list (or policy) that holds the block while it is free;
    ``sampled`` marks the blocks the residency metrics follow.
    """

    __slots__ = (
        "block_id",
        "ref_count",
        "block_hash",
        "parent_hash",
        "token_ids",
        "extra_keys",
        "cache_salt",
        "prev_free",
        "next_free",
        "hits",
        "policy_state",
        "free_in",
        "sampled",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: bytes | None = None
        self.parent_hash: bytes | None = None
        self.token_ids: tuple[int, ...] = ()
        self.extra_keys: tuple = ()
        self.cache_salt: str | None = None
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None
        self.hits = 0
        self.policy_state = 0
        self.free_in = None
        self.sampled = False

    def clear_hash(self) -> None:
        """Forgets the cached content (the block's data is now meaningless)."""
        self.block_hash = None
        self.parent_hash = None
        self.token_ids = ()
        self.extra_keys = ()
        self.cache_salt = None
        self.hits = 0
        self.policy_state = 0
        self.sampled = False

    def __repr__(self) -> str:
        return f"KVBlock(id={self.block_id}, ref={self.ref_count}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Doubly linked list of blocks; every operation is O(1) per block it moves."""

    def __init__(self, blocks: Sequence[KVBlock] = ()) -> None:
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

    def first(self) -> KVBlock | None:
        """The head block, or None when empty."""
        node = self._head.next_free
        return None if node is self._tail else node

    def next_of(self, block: KVBlock) -> KVBlock | None:
        """The block after ``block`` (towards the tail), or None at the tail."""
        node = block.next_free
        return None if node is self._tail else node

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

    def popleft(self) -> KVBlock:
        """Removes and returns the head block (IndexError when empty)."""
        node = self._head.next_free
        if node is self._tail:
            raise IndexError("pop from an empty FreeBlockQueue")
        self.remove(node)
        return node

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

    def check_links(self) -> None:
        """AssertionError unless back links agree with forward links and the length counter (O(n))."""
        node, count = self._head, 0
        for block in self:
            assert block.prev_free is node, f"block {block.block_id}: broken prev link"
            node, count = block, count + 1
        assert self._tail.prev_free is node, "broken tail link"
        assert count == self._len, f"list holds {count} blocks, its counter says {self._len}"
