"""What an eviction policy is: the set of cached blocks at ref count 0, and the choice among them.

The block pool owns ref counts, the prefix-cache map, the list of free blocks
that hold nothing (reused before anything cached is evicted) and the pinned
blocks (evicted only after every unpinned one). A policy sees only the cached,
unpinned blocks nobody holds, through four calls:

* ``add(block)``: the block's last reference was dropped. Blocks a sequence
  frees together arrive deepest first (``KVCacheManager.free`` releases its
  table in reverse), so a policy that keeps arrival order among equals evicts
  the deepest first and never strands a child behind an evicted parent.
* ``remove(block)``: a prefix hit revives the block (or a pin moves it out).
  Hits taken while a block is in use are counted on the block (``block.hits``),
  which the policy reads when the block comes back: it needs no call per hit.
* ``pop()``: the pool needs a victim; the policy unlinks and returns it.
* ``__iter__``: the blocks in the order they would be evicted if nothing else
  happened (O(n); snapshots and the invariant checker use it, never the hot path).

Every policy must hold blocks only while they are free and cached: the pool
never hands a block with ``ref_count > 0`` to ``add`` and removes a block
before taking a reference on it, so rule 4 (a held block is never evicted)
holds whatever the policy does.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import ClassVar

from jaxpaged.cache.blocks import KVBlock


class EvictionPolicy(abc.ABC):
    """Chooses which cached block at ref count 0 is evicted next (see the module docstring)."""

    name: ClassVar[str]
    cost: ClassVar[str]  # the documented cost per block touched, e.g. "O(1)"

    def __init__(self, num_blocks: int) -> None:
        """``num_blocks``: the pool's size (policies with segments size them from it)."""
        self.num_blocks = num_blocks
        # what a held block's ``free_in`` names: the policy, or the one list it keeps every block in
        # (then the pool unlinks a revived block itself, inline, instead of calling ``remove``)
        self.home: object = self

    @abc.abstractmethod
    def __len__(self) -> int:
        """Blocks the policy holds."""

    @abc.abstractmethod
    def add(self, block: KVBlock) -> None:
        """A cached block's last reference was dropped: it becomes a candidate."""

    @abc.abstractmethod
    def remove(self, block: KVBlock) -> None:
        """``block`` (held by this policy) stops being a candidate."""

    @abc.abstractmethod
    def pop(self) -> KVBlock:
        """Unlinks and returns the next victim; IndexError when the policy holds nothing."""

    @abc.abstractmethod
    def __iter__(self) -> Iterator[KVBlock]:
        """The held blocks in eviction order, as if nothing else happened (O(n))."""

    def check(self) -> None:
        """AssertionError if the policy's own structures disagree (O(n); invariant checks only)."""
