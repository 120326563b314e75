"""SIEVE (Zhang et al., NSDI'24): a FIFO queue with a visited bit and a hand that sweeps it once.

Adapted to a cache whose entries come and go as references are taken: a block
in use is not a candidate, so a prefix hit takes it out of the queue (O(1))
and, when its last reference is dropped again, it re-enters at the new end.
The block's ``policy_state`` is its hit count when the hand last looked at it,
so "visited" means hit since then (``block.hits > block.policy_state``); a
block hit while in use comes back visited without any call per hit.
"""

from __future__ import annotations

from collections.abc import Iterator

from jaxpaged.cache.blocks import FreeBlockQueue, KVBlock
from jaxpaged.cache.eviction.base import EvictionPolicy


class SievePolicy(EvictionPolicy):
    """Head = oldest. The hand moves from the head towards the tail and wraps around.

    Eviction: a visited block under the hand is spared (its bit cleared) and
    the hand moves on; the first unvisited block is evicted and the hand stays
    at its successor. O(1) amortized per block: each step the hand passes over
    a visited block clears a bit that one hit set. Blocks freed together enter
    deepest first, so among unvisited ones the deepest is evicted first.
    """

    name = "sieve"
    cost = "O(1) amortized"

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.queue = FreeBlockQueue()
        self._hand: KVBlock | None = None  # None: the head

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, block: KVBlock) -> None:
        """Enters at the tail (newest)."""
        self.queue.append(block)

    def remove(self, block: KVBlock) -> None:
        """Unlinks the block; a hand resting on it moves to its successor."""
        if block is self._hand:
            self._hand = self.queue.next_of(block)
        self.queue.remove(block)

    def pop(self) -> KVBlock:
        """Sweeps from the hand to the first unvisited block and evicts it."""
        queue = self.queue
        node = self._hand or queue.first()
        if node is None:
            raise IndexError("pop from an empty SievePolicy")
        while node.hits > node.policy_state:
            node.policy_state = node.hits
            node = queue.next_of(node) or queue.first()
        self._hand = queue.next_of(node)
        queue.remove(node)
        return node

    def __iter__(self) -> Iterator[KVBlock]:
        ring = list(self.queue)
        if not ring:
            return iter(())
        start = ring.index(self._hand) if self._hand is not None else 0
        ring = ring[start:] + ring[:start]
        # the first sweep evicts the unvisited in ring order, clearing the visited ones it passes up to
        # the last victim; then the hand clears those after it, wraps, and evicts the cleared ones
        # before it first
        unvisited = [i for i, b in enumerate(ring) if b.hits <= b.policy_state]
        visited = [b for b in ring if b.hits > b.policy_state]
        if not unvisited:
            return iter(visited)
        last = unvisited[-1]
        after = [b for b in ring[last + 1:] if b.hits > b.policy_state]
        before = [b for b in ring[:last] if b.hits > b.policy_state]
        return iter([ring[i] for i in unvisited] + before + after)

    def check(self) -> None:
        """Links agree; the hand rests on a held block."""
        self.queue.check_links()
        if self._hand is not None:
            assert any(b is self._hand for b in self.queue), "the SIEVE hand points outside the queue"
