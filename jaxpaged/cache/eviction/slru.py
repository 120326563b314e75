"""Segmented LRU (Karedla et al., 1994; SGLang's ``slru``): a probation and a protected segment."""

from __future__ import annotations

from collections.abc import Iterator

from jaxpaged.cache.blocks import FreeBlockQueue, KVBlock
from jaxpaged.cache.eviction.base import EvictionPolicy

_PROBATION, _PROTECTED = 0, 1
PROTECTED_FRACTION = 0.8


class SLRUPolicy(EvictionPolicy):
    """Two LRU lists, O(1) per block.

    A freed block that was never hit since it was cached joins the probation
    tail; one that was hit joins the protected tail. The protected segment
    holds at most ``PROTECTED_FRACTION`` of the pool: past that its LRU block
    is demoted to the probation tail. Victims come from the probation head, and
    from the protected head only when probation is empty. Within each segment
    blocks freed together stay deepest first; across segments a parent is only
    ever more protected than its child (a hit on a child hits its parent too).
    """

    name = "slru"
    cost = "O(1)"

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.probation = FreeBlockQueue()
        self.protected = FreeBlockQueue()
        self.protected_cap = max(1, int(PROTECTED_FRACTION * num_blocks))

    def __len__(self) -> int:
        return len(self.probation) + len(self.protected)

    def add(self, block: KVBlock) -> None:
        """Probation if never hit, else protected (demoting its LRU block past the cap)."""
        if block.hits == 0:
            block.policy_state = _PROBATION
            self.probation.append(block)
            return
        block.policy_state = _PROTECTED
        self.protected.append(block)
        if len(self.protected) > self.protected_cap:
            demoted = self.protected.popleft()
            demoted.policy_state = _PROBATION
            self.probation.append(demoted)

    def remove(self, block: KVBlock) -> None:
        """Unlinks the block from its segment."""
        (self.protected if block.policy_state == _PROTECTED else self.probation).remove(block)

    def pop(self) -> KVBlock:
        """Probation's LRU block, else protected's."""
        if len(self.probation):
            return self.probation.popleft()
        return self.protected.popleft()

    def __iter__(self) -> Iterator[KVBlock]:
        yield from self.probation
        yield from self.protected

    def check(self) -> None:
        """Links agree; each block's segment tag matches its list; protected within its cap."""
        for queue, tag in ((self.probation, _PROBATION), (self.protected, _PROTECTED)):
            queue.check_links()
            assert all(b.policy_state == tag for b in queue), "a block's SLRU segment tag is wrong"
        assert len(self.protected) <= self.protected_cap, "the protected segment is over its cap"
