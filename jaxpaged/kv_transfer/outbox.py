"""The prefill side's outbox: finished requests' prompt blocks, by key, until pulled or pushed out.

Filled by the engine thread (``put``), read by the transport's server thread
(``get_many``), so every access takes one lock. Bounded in blocks; least
recently used entries go first. A block read from the pool right after its
request finished cannot be overwritten afterwards, so the outbox serves it
even if the pool evicts the block meanwhile.
"""

from __future__ import annotations

import collections
import threading

import numpy as np


class KVOutbox:
    """LRU map ``key -> block`` of at most ``capacity_blocks`` entries, safe across threads."""

    def __init__(self, capacity_blocks: int):
        if capacity_blocks < 1:
            raise ValueError(f"the KV outbox must hold at least one block, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._blocks: collections.OrderedDict[bytes, np.ndarray] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocks)

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key in self._blocks

    def put(self, key: bytes, block: np.ndarray) -> None:
        """Insert (or refresh) one block, pushing out the least recently used beyond capacity."""
        with self._lock:
            self._blocks[key] = block
            self._blocks.move_to_end(key)
            while len(self._blocks) > self.capacity_blocks:
                self._blocks.popitem(last=False)

    def get_many(self, keys: list[bytes]) -> list[tuple[bytes, np.ndarray]]:
        """The ``(key, block)`` pairs held for ``keys``, in their order (missing keys are skipped)."""
        with self._lock:
            found = [(key, self._blocks[key]) for key in keys if key in self._blocks]
            for key, _ in found:
                self._blocks.move_to_end(key)
            return found
