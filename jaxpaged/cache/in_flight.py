"""Which full blocks running sequences are computing right now, by hash.

Lets a newcomer see that the blocks right after its cached prefix are about to
be published by another sequence, so the scheduler can defer it a step instead
of computing the same prefix twice (``PrefixMatch.num_pending_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence


class InFlightHashes:
    """Per block hash, how many running sequences are computing that block now.

    Each sequence registers a window ``[start, end)`` of indices into its own
    list of block hashes; both ends only move forward (blocks get committed,
    more blocks get allocated), so every update touches only the blocks that
    entered or left the window.
    """

    def __init__(self) -> None:
        self.counts: dict[bytes, int] = {}

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.counts

    def move_window(self, hashes: Sequence[bytes], old: tuple[int, int], new: tuple[int, int]) -> None:
        """Re-registers a sequence's window from ``old`` to ``new`` (neither end moving back)."""
        (old_start, old_end), (new_start, new_end) = old, new
        counts = self.counts
        for index in range(old_start, min(old_end, new_start)):
            block_hash = hashes[index]
            if counts[block_hash] == 1:
                del counts[block_hash]
            else:
                counts[block_hash] -= 1
        for index in range(max(old_end, new_start), new_end):
            block_hash = hashes[index]
            counts[block_hash] = counts.get(block_hash, 0) + 1
