"""Least frequently used, ties broken least recently used (SGLang's ``lfu``)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from jaxpaged.cache.blocks import KVBlock
from jaxpaged.cache.eviction.base import EvictionPolicy

_REMOVED = -1


class LFUPolicy(EvictionPolicy):
    """A binary heap keyed by (hits, free order): O(log n) per block added or evicted, O(1) to revive.

    ``hits`` counts the references taken on a block since it was cached (every
    prefix hit, wherever the block was). Among blocks with equal counts the one
    freed first goes first, and blocks freed together arrive deepest first, so
    the deepest goes first among equals. A prefix hit takes the whole chain up
    to the block it reaches, so a parent's count is never below its child's
    (unless the parent was evicted and computed again): a parent is not evicted
    before a child it still serves. Revival is lazy: the block's heap entry is
    marked dead (its stamp no longer matches ``block.policy_state``) and skipped
    when it surfaces; the heap is rebuilt from the live entries when dead ones
    outnumber them, so its size stays O(live).
    """

    name = "lfu"
    cost = "O(log n)"

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._heap: list[tuple[int, int, KVBlock]] = []
        self._stamps = itertools.count(1)  # 0 is what a fresh block carries
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def add(self, block: KVBlock) -> None:
        """Pushes (hits, stamp); the stamp identifies the block's one live entry."""
        stamp = next(self._stamps)
        block.policy_state = stamp
        heapq.heappush(self._heap, (block.hits, stamp, block))
        self._live += 1

    def remove(self, block: KVBlock) -> None:
        """Marks the block's entry dead (O(1)); rebuilds the heap when most entries are dead."""
        block.policy_state = _REMOVED
        self._live -= 1
        if len(self._heap) > 2 * self._live + 64:
            self._heap = [entry for entry in self._heap if entry[1] == entry[2].policy_state]
            heapq.heapify(self._heap)

    def pop(self) -> KVBlock:
        """The live entry with the fewest hits, freed earliest."""
        heap = self._heap
        while heap:
            _, stamp, block = heapq.heappop(heap)
            if stamp == block.policy_state:
                block.policy_state = _REMOVED
                self._live -= 1
                return block
        raise IndexError("pop from an empty LFUPolicy")

    def __iter__(self) -> Iterator[KVBlock]:
        live = sorted(entry[:2] + (entry[2].block_id,) for entry in self._heap if entry[1] == entry[2].policy_state)
        by_id = {entry[2].block_id: entry[2] for entry in self._heap}
        return iter([by_id[block_id] for _, _, block_id in live])

    def check(self) -> None:
        """One live entry per held block, keyed by its current hit count."""
        live = [entry for entry in self._heap if entry[1] == entry[2].policy_state]
        assert len(live) == self._live, f"{len(live)} live heap entries, counter says {self._live}"
        assert len({id(entry[2]) for entry in live}) == len(live), "a block has two live heap entries"
        for hits, _, block in live:
            assert hits == block.hits, f"block {block.block_id}: heap key {hits} != its {block.hits} hits"
