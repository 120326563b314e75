"""Plain records the KV cache manager hands out and keeps per sequence."""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import NamedTuple

from jaxpaged.cache.block_pool import KVBlock


@dataclass(slots=True)
class PrefixMatch:
    """Result of :meth:`KVCacheManager.match_prefix`; pass it to ``allocate_new``.

    Attributes:
      blocks: physical ids of the longest run of cached full blocks, as a flat
        table (entry ``j * G + g`` is KV cache group ``g``'s block; 0 where a
        sliding group needs none).
      num_cached_tokens: ``len(blocks) * block_size``; at most ``len(token_ids) - 1``
        so that at least one prompt token is computed.
      block_hashes: chained hashes of all full blocks of the token ids (reused by
        ``allocate_new`` and ``commit`` instead of re-hashing).
      num_pending_tokens: tokens in further full blocks, right after the cached
        run, that another running sequence is computing now (allocated, not yet
        committed). A scheduler may defer the request a step to hit them instead
        of computing them again.
      group_blocks: each group's matched blocks (None where a sliding group
        needs none). After ``KVCacheManager.apply_extension`` they run past
        ``num_cached_tokens`` (the device hit): the entries there are device
        blocks or ``FROM_TIER`` (a fresh block a lower tier or a connector fills).
      num_extended_tokens: tokens the extended group lists make computed (0: not extended).
    """

    blocks: list[int]
    num_cached_tokens: int
    block_hashes: list[bytes]
    num_pending_tokens: int = 0
    num_tokens: int = 0
    request_keys: tuple = ()
    cache_epoch: int = 0
    matched: list[KVBlock] = field(default_factory=list, repr=False, compare=False)
    group_blocks: list[list] = field(default_factory=list, repr=False, compare=False)
    num_extended_tokens: int = 0


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of pool occupancy and prefix-cache counters.

    ``usage`` counts only blocks held by sequences (``ref_count > 0``); cached
    blocks nobody holds are free, as in vLLM. Query and hit counts are in tokens,
    counted once per successful admission.
    """

    num_blocks: int
    num_used_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    num_sequences: int
    usage: float
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    num_evictions: int
    num_cow_copies: int
    num_pinned_blocks: int = 0  # free cached blocks a pin keeps from the eviction policy
    # evictions by reason (``jaxpaged.cache.block_pool.EVICTION_REASONS``); resets count every block dropped
    evictions_by_reason: dict = field(default_factory=dict)

    @property
    def prefix_hit_rate(self) -> float:
        """Hit tokens over queried tokens (0 before any query)."""
        return self.prefix_hits_tokens / self.prefix_queries_tokens if self.prefix_queries_tokens else 0.0


class BlockTableUpdate(NamedTuple):
    """What :meth:`KVCacheManager.allocate_slots` changed in one sequence's block table.

    Entries from index ``start`` on are now ``block_ids``: blocks appended, or a
    shared block replaced by its private copy (and whatever was appended after
    it). ``copies`` are the ``(src, dst)`` block copies the device must make
    before the step (copy-on-write). ``NO_CHANGE`` (the common decode step) has
    neither. (A NamedTuple: one is made at every block allocation.)
    """

    start: int
    block_ids: Sequence[int]  # a copy
    copies: tuple[tuple[int, int], ...] = ()


NO_CHANGE = BlockTableUpdate(0, ())


@dataclass(slots=True)
class SequenceState:
    """What the manager knows about one live sequence.

    Attributes:
      tables: one table of physical block ids per KV cache group, in token
        order, all of the same length (``NULL_BLOCK`` where a block slid out
        of a sliding group's window).
      skipped: per group, the leading entries that are ``NULL_BLOCK``.
      num_computed: leading tokens whose K/V are in the pool (committed). The
        tokens scheduled past them (steps in flight) are counted by the caller
        alone (the scheduler's ``Sequence.num_computed_tokens``), who passes
        that count to ``allocate_slots``.
      num_cached_tokens: tokens served from the prefix cache at admission.
      block_hashes: known chained hashes of leading full blocks (from the prompt
        at admission, extended at commit as generated tokens fill blocks).
      num_hashed_blocks: leading full computed blocks already offered to the cache.
      request_keys: block 0's extra keys (salt and request-level keys).
      pending: ``[start, end)`` block indices registered as "being computed" in
        the manager's in-flight map (group 0's blocks; the hashes are shared).
    """

    tables: list[list[int]]
    skipped: list[int]
    num_computed: int
    num_cached_tokens: int
    block_hashes: list[bytes]
    num_hashed_blocks: int
    request_keys: tuple
    pending: tuple[int, int] = (0, 0)


class CachedBlockInfo(NamedTuple):
    """One prefix-cache entry as :meth:`KVCacheManager.cached_blocks` reports it.

    ``parent_hash`` is None for a sequence's first block, whose ``extra_keys``
    are the request keys (cache salt, ...); later blocks have none.
    """

    block_id: int
    block_hash: bytes
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    extra_keys: tuple
    ref_count: int
