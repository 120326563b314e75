"""Pinned prefixes: block hashes kept out of the eviction policy until a deadline.

A pin names block hashes, not blocks, so a prefix can be pinned before it is
computed and stays pinned across an eviction and recompute. While a hash's pin
is live, its cached block at ref count 0 waits in the pool's pinned list (LRU
among pinned) instead of the policy, and is evicted only when the policy has
nothing left. Deadlines sit in a heap, so expiring is O(log n) per pin and
checking whether anything expired is O(1).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable


class PinTable:
    """hash -> deadline on ``clock``; the latest pin of a hash wins (a TTL of 0 unpins)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        """``clock`` returns seconds (the engine's clock: real or simulated)."""
        self.clock = clock
        self.deadlines: dict[bytes, float] = {}
        self._heap: list[tuple[float, bytes]] = []

    def __len__(self) -> int:
        return len(self.deadlines)

    def __contains__(self, block_hash: bytes) -> bool:
        """Whether ``block_hash`` has a pin that has not run out."""
        deadline = self.deadlines.get(block_hash)
        return deadline is not None and deadline > self.clock()

    def pin(self, hashes: Iterable[bytes], ttl_s: float) -> list[bytes]:
        """Pins ``hashes`` until now + ``ttl_s`` (``ttl_s <= 0``: unpin); returns the hashes unpinned."""
        if ttl_s <= 0:
            return [h for h in hashes if self.deadlines.pop(h, None) is not None]
        deadline = self.clock() + ttl_s
        for block_hash in hashes:
            self.deadlines[block_hash] = deadline
            heapq.heappush(self._heap, (deadline, block_hash))
        return []

    def expired(self) -> list[bytes]:
        """Drops and returns the hashes whose pins ran out (O(1) when none did)."""
        heap = self._heap
        if not heap:
            return []
        now = self.clock()
        gone = []
        while heap and heap[0][0] <= now:
            deadline, block_hash = heapq.heappop(heap)
            if self.deadlines.get(block_hash) == deadline:  # not re-pinned (or unpinned) since
                del self.deadlines[block_hash]
                gone.append(block_hash)
        if len(heap) > 2 * len(self.deadlines) + 64:  # unpins and re-pins leave dead entries
            self._heap = [(d, h) for h, d in self.deadlines.items()]
            heapq.heapify(self._heap)
        return gone
