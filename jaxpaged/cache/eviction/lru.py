"""Least recently used: the order blocks were freed in (vLLM's and SGLang's default)."""

from __future__ import annotations

from collections.abc import Iterator

from jaxpaged.cache.blocks import FreeBlockQueue, KVBlock
from jaxpaged.cache.eviction.base import EvictionPolicy


class LRUPolicy(EvictionPolicy):
    """One linked list: freed blocks join the tail, victims leave the head. O(1) per block.

    Blocks freed together arrive deepest first, so among them the deepest is
    evicted first.
    """

    name = "lru"
    cost = "O(1)"

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.queue = FreeBlockQueue()
        self.home = self.queue  # a revived block is unlinked by the pool, inline

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, block: KVBlock) -> None:
        """Joins the tail (most recently used)."""
        self.queue.append(block)

    def remove(self, block: KVBlock) -> None:
        """Unlinks the block from wherever it is."""
        self.queue.remove(block)

    def pop(self) -> KVBlock:
        """The head: freed longest ago."""
        return self.queue.popleft()

    def __iter__(self) -> Iterator[KVBlock]:
        return iter(self.queue)

    def check(self) -> None:
        """The list's links and counter agree."""
        self.queue.check_links()
