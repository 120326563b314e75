"""The naive contiguous-KV baseline: one region of ``max_model_len`` reserved per sequence.

This is the kind of server the PagedAttention paper compares against (and
FasterTransformer / Orca-style pre-allocation): at admission a sequence gets a
run of consecutive physical blocks big enough for ``max_model_len`` tokens,
whatever its real length. There is no sharing and no prefix caching, and
admission is limited by those reservations: with ``num_blocks`` blocks at most
``num_blocks // ceil(max_model_len / block_size)`` sequences run at once. The
leftover blocks (``num_blocks`` modulo the region size) are never used.

Same interface as :class:`jaxpaged.cache.KVCacheManager`, so the engine and
scheduler drive it unchanged (``EngineConfig(kv_layout="contiguous")``).
``block_table`` lists only the region's blocks that hold tokens allocated so far
(the rest of the region is reserved but the step need not read it).
``fork`` is not supported: parallel sampling and beam search raise ValueError
(copying a region would need a device copy the engine does not issue on fork).

For a model with sliding-window layers (``num_groups`` KV cache groups) the
baseline treats every layer as full attention, as a server without a hybrid
manager would: each group gets ``ceil(max_model_len / block_size)`` blocks of
the region (``G`` consecutive blocks per ``block_size`` tokens, so the flat
table ``j * G + g`` is one run of block ids) and nothing slides out. The
attention still masks to each layer's window; only the memory is all-full.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Hashable, Sequence

from jaxpaged.cache.hashing import request_extra_keys
from jaxpaged.cache.namespaces import Namespace
from jaxpaged.cache.records import NO_CHANGE, BlockTableUpdate, CacheStats, PrefixMatch
from jaxpaged.mathutils import cdiv



@dataclasses.dataclass
class _Region:
    """One sequence's reservation: region index, slots handed out, slots written."""

    index: int
    num_allocated: int
    num_computed: int


class ContiguousKVCacheManager:
    """Fixed-size contiguous regions, one per sequence, reserved for ``max_model_len`` tokens."""

    enable_prefix_caching = False
    unitary = False  # a region per sequence, not tables that grow block by block
    eviction_policy = "none"  # nothing is ever cached, so nothing is evicted
    residency = None
    on_evict = None

    def __init__(self, num_blocks: int, block_size: int, *, max_model_len: int, num_groups: int = 1) -> None:
        """Split ``num_blocks`` blocks into regions of ``num_groups * ceil(max_model_len / block_size)`` blocks.

        Raises:
          ValueError: a non-positive size, or one region larger than the pool.
        """
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size),
                            ("max_model_len", max_model_len), ("num_groups", num_groups)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.num_groups = num_groups
        self.region_blocks = num_groups * cdiv(max_model_len, block_size)
        if self.region_blocks > num_blocks:
            raise ValueError(f"one region of {max_model_len} tokens ({num_groups} KV cache group(s)) needs "
                             f"{self.region_blocks} blocks; "
                             f"the pool has only {num_blocks}")
        self.num_regions = num_blocks // self.region_blocks
        self._free_regions = list(range(self.num_regions))  # a min-heap: lowest region first
        self._seqs: dict[Hashable, _Region] = {}

    # ----------------------------------------------------------------- queries

    @property
    def num_free_blocks(self) -> int:
        """Blocks not reserved by any sequence (the unusable remainder included)."""
        return self.num_blocks - len(self._seqs) * self.region_blocks

    def can_fit(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens fits one region."""
        return num_tokens <= self.max_model_len

    def block_table(self, seq_id: Hashable) -> list[int]:
        """The region's physical block ids that hold the sequence's allocated tokens."""
        region = self._seq(seq_id)
        start = region.index * self.region_blocks
        return list(range(start, start + self.num_groups * cdiv(region.num_allocated, self.block_size)))

    def num_blocks_held(self, seq_id: Hashable) -> int:
        """Blocks the sequence keeps from others: its whole region."""
        self._seq(seq_id)
        return self.region_blocks

    def held_blocks(self, seq_id: Hashable) -> list[int]:
        """The sequence's blocks that hold tokens (``block_table``: nothing slides out)."""
        return self.block_table(seq_id)

    def pin_prefix(self, token_ids: Sequence[int], ttl_s: float, *, cache_salt: str | None = None) -> int:
        """Always ValueError: there is no prefix cache to keep blocks in."""
        raise ValueError("pinning needs the paged KV layout with enable_prefix_caching")

    def reserved_blocks(self, seq_id: Hashable) -> list[int]:
        """Every block of the sequence's region, used or not."""
        start = self._seq(seq_id).index * self.region_blocks
        return list(range(start, start + self.region_blocks))

    def num_computed_tokens(self, seq_id: Hashable) -> int:
        """Leading tokens of the sequence whose K/V are in the pool."""
        return self._seq(seq_id).num_computed

    def num_cached_tokens(self, seq_id: Hashable) -> int:
        """Always 0: there is no prefix cache."""
        self._seq(seq_id)
        return 0

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    @property
    def stats(self) -> CacheStats:
        """Occupancy counting whole reservations as used; prefix counters stay 0."""
        used = len(self._seqs) * self.region_blocks
        return CacheStats(
            num_blocks=self.num_blocks,
            num_used_blocks=used,
            num_free_blocks=self.num_blocks - used,
            num_cached_blocks=0,
            num_sequences=len(self._seqs),
            usage=used / self.num_blocks,
            prefix_queries_tokens=0,
            prefix_hits_tokens=0,
            num_evictions=0,
            num_cow_copies=0,
        )

    def _seq(self, seq_id: Hashable) -> _Region:
        region = self._seqs.get(seq_id)
        if region is None:
            raise ValueError(f"sequence {seq_id!r} is not held by the cache manager (never allocated or already freed)")
        return region

    def _check_fits(self, num_tokens: int, what: str) -> None:
        if not self.can_fit(num_tokens):
            raise ValueError(f"{what} of {num_tokens} tokens exceeds the {self.max_model_len}-token region")

    # --------------------------------------------------------------- admission

    def match_prefix(self, token_ids: Sequence[int], *, cache_salt: str | None = None,
                     extra_keys: tuple = ()) -> PrefixMatch:
        """A match with no hits (no prefix cache); pass it to ``allocate_new``."""
        return PrefixMatch([], 0, [], num_tokens=len(token_ids),
                           request_keys=request_extra_keys(cache_salt, extra_keys))

    def allocate_new(self, seq_id: Hashable, token_ids: Sequence[int], num_new_tokens: int,
                     match: PrefixMatch | None = None, *, cache_salt: str | None = None,
                     extra_keys: tuple = (), count_query: bool = True) -> bool:
        """Reserve a whole region for a new sequence; False, changing nothing, when none is free.

        Raises:
          ValueError: the sequence exists, is empty or longer than a region,
            ``num_new_tokens`` is out of range, or ``match`` claims hits.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} is already allocated")
        if not token_ids:
            raise ValueError(f"sequence {seq_id!r} has no tokens")
        self._check_fits(len(token_ids), f"sequence {seq_id!r}")
        if match is not None and match.num_cached_tokens:
            raise ValueError("the contiguous baseline has no prefix cache; the match must have no hits")
        if not 0 <= num_new_tokens <= len(token_ids):
            raise ValueError(f"num_new_tokens must be in [0, {len(token_ids)}], got {num_new_tokens}")
        if not self._free_regions:
            return False
        self._seqs[seq_id] = _Region(heapq.heappop(self._free_regions), num_new_tokens, 0)
        return True

    # ------------------------------------------------------------------- growth

    def allocate_slots(self, seq_id: Hashable, num_new_tokens: int, *, num_computed_tokens: int) -> BlockTableUpdate:
        """Hand out ``num_new_tokens`` more slots after the first ``num_computed_tokens`` (the caller's count)
        of the reserved region; never fails, never copies.

        Returns the region's blocks that the new slots bring into the block table.

        Raises:
          ValueError: unknown sequence, negative count, a start before the committed tokens or past
            the slots handed out, or growth past the region.
        """
        region = self._seq(seq_id)
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        if not region.num_computed <= num_computed_tokens <= region.num_allocated:
            raise ValueError(f"num_computed_tokens for {seq_id!r} must be in [{region.num_computed}, "
                             f"{region.num_allocated}], got {num_computed_tokens}")
        end = num_computed_tokens + num_new_tokens
        self._check_fits(end, f"sequence {seq_id!r} grown")
        old_blocks = self.num_groups * cdiv(region.num_allocated, self.block_size)
        region.num_allocated = max(region.num_allocated, end)
        new_blocks = self.num_groups * cdiv(region.num_allocated, self.block_size)
        if new_blocks == old_blocks:
            return NO_CHANGE
        first = region.index * self.region_blocks
        return BlockTableUpdate(old_blocks, list(range(first + old_blocks, first + new_blocks)))

    def release_slots_after(self, seq_id: Hashable, num_tokens: int) -> int:
        """Nothing to release: a region reserves max_model_len slots for its whole life; returns 0."""
        return 0

    def commit(self, seq_id: Hashable, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Record that the first ``num_computed_tokens`` tokens now have K/V.

        Raises:
          ValueError: unknown sequence, or a count going backwards or past the allocated slots.
        """
        region = self._seq(seq_id)
        limit = min(len(token_ids), region.num_allocated)
        if not region.num_computed <= num_computed_tokens <= limit:
            raise ValueError(f"num_computed_tokens for {seq_id!r} must be in [{region.num_computed}, {limit}], "
                             f"got {num_computed_tokens}")
        region.num_computed = num_computed_tokens

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Unsupported: the baseline shares nothing and the engine issues no copy on fork.

        Raises:
          ValueError: always.
        """
        raise ValueError("the contiguous-KV baseline does not support n > 1 or beam search (no fork)")

    # ------------------------------------------------------------------ release

    def free(self, seq_id: Hashable) -> None:
        """Return the sequence's region to the free list.

        Raises:
          ValueError: the sequence is unknown or was already freed.
        """
        region = self._seq(seq_id)
        del self._seqs[seq_id]
        heapq.heappush(self._free_regions, region.index)

    def reset_prefix_cache(self, namespace: Namespace | None = None) -> bool:
        """Nothing to drop; True when no sequence holds a region (as the paged manager's rule), or for a
        namespace (never refused)."""
        return namespace is not None or not self._seqs

    # --------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Regions are disjoint, free and held regions partition the pool, counts stay in range."""
        held = [r.index for r in self._seqs.values()]
        assert len(held) == len(set(held)), f"a region is held twice: {sorted(held)}"
        free = list(self._free_regions)
        assert len(free) == len(set(free)), f"a region is free twice: {sorted(free)}"
        assert sorted(held + free) == list(range(self.num_regions)), (
            f"held {sorted(held)} and free {sorted(free)} regions must partition 0..{self.num_regions - 1}")
        for seq_id, r in self._seqs.items():
            assert 0 <= r.num_computed <= r.num_allocated <= self.max_model_len, (
                f"{seq_id!r}: computed {r.num_computed}, allocated {r.num_allocated}, region {self.max_model_len}")
