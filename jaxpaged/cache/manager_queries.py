"""The KV cache manager's read-only side: token counts, pool statistics and hooks, events, cache listing.

`KVCacheManager` keeps its sequences in `_seqs` (looked up by `_seq`, which
raises for an unknown id) with one table per KV cache group, its blocks in a
`BlockPool` (`_pool`), its groups' rules in a `KVCacheCoordinator`
(`_coordinator`; `_unitary` for one full-attention group), the prefix-cache
counters and an `InFlightHashes` (`_in_flight`), and the lower tiers' event
hooks (`_event_sources`); this mixin answers from them, so the manager's own
file holds the allocation rules.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from jaxpaged.cache.block_pool import EvictCallback
from jaxpaged.cache.events import KVEvent, KVEventLog
from jaxpaged.cache.kv_groups import NULL_BLOCK, PAD_BLOCK, interleave_tables
from jaxpaged.cache.namespaces import Namespace, check_namespace
from jaxpaged.cache.records import CachedBlockInfo, CacheStats
from jaxpaged.cache.residency import ResidencyTracker
from jaxpaged.mathutils import cdiv


class ManagerQueries:
    """Queries and pool hooks over `_seqs`, `_pool` and the prefix-cache counters of `KVCacheManager`."""

    @property
    def eviction_policy(self) -> str:
        """The name of the policy choosing among cached blocks at ref count 0."""
        return self._pool.policy.name

    @property
    def unitary(self) -> bool:
        """One full-attention KV cache group (a plain model): one table per sequence, keyed by the plain hashes."""
        return self._unitary

    @property
    def num_slid_out_blocks(self) -> int:
        """Block references sliding groups have dropped so far because they fell out of the window."""
        return self._num_slid_out

    def max_blocks_for(self, num_tokens: int) -> int:
        """The most blocks (all groups) a sequence of ``num_tokens`` tokens holds at once."""
        return self._coordinator.max_blocks_for(num_tokens)

    def can_fit(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens could ever fit the pool."""
        if self._unitary:
            return cdiv(num_tokens, self.block_size) <= self.num_blocks
        return self._coordinator.max_blocks_for(num_tokens) <= self.num_blocks

    def block_table(self, seq_id: Hashable) -> list[int]:
        """The sequence's flat table: entry ``j * G + g`` is group ``g``'s ``j``-th block (slid out: 0)."""
        tables = self._seq(seq_id).tables
        return list(tables[0]) if self._unitary else interleave_tables(tables, PAD_BLOCK)

    def held_blocks(self, seq_id: Hashable) -> list[int]:
        """The block ids the sequence holds, every group, slid-out entries left out."""
        return [b for b in interleave_tables(self._seq(seq_id).tables, NULL_BLOCK) if b != NULL_BLOCK]

    def group_block_tables(self, seq_id: Hashable) -> list[list[int]]:
        """A copy of each group's table (``NULL_BLOCK`` where a block slid out)."""
        return [list(table) for table in self._seq(seq_id).tables]

    def num_blocks_held(self, seq_id: Hashable) -> int:
        """Blocks the sequence holds over all groups (no copy: cheap enough for every step)."""
        seq = self._seq(seq_id)
        return sum(len(table) - skipped for table, skipped in zip(seq.tables, seq.skipped))

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by any sequence (cached-evictable ones included)."""
        return self._pool.num_free

    @property
    def on_evict(self) -> EvictCallback | None:
        """Called as ``on_evict(block_id, block_hash, token_ids, parent_hash, cache_salt)`` when a cached block
        is reused."""
        return self._pool.on_evict

    @on_evict.setter
    def on_evict(self, callback: EvictCallback | None) -> None:
        self._pool.on_evict = callback

    @property
    def residency(self) -> ResidencyTracker | None:
        """The sampled block-residency tracker, once :meth:`track_residency` started it."""
        return self._pool.residency

    def track_residency(self, sample: float) -> ResidencyTracker:
        """Follows one cached block in ``round(1 / sample)``: lifetimes, idle-before-evict, reuse gaps.

        With KV cache groups every group's cached blocks count (a block id holds
        one group's layers); a sliding group's block is freed when it slides out.
        """
        return self._pool.track_residency(sample)

    @property
    def event_log(self) -> KVEventLog | None:
        """The log events are recorded in, or None while events are off."""
        return self._pool.events

    def take_events(self) -> list[KVEvent]:
        """Events recorded since the last call, oldest first ([] when events are off)."""
        log = self._pool.events
        return log.take() if log is not None else []

    def disable_events(self) -> None:
        """Stops recording events and drops the log (no tier does event work after)."""
        self._pool.events = None
        for attach in self._event_sources:
            attach(None)

    def add_event_source(self, attach: Callable[[KVEventLog | None], None]) -> None:
        """Lets a lower KV tier (``jaxpaged.offload``) publish into this manager's events.

        ``attach(log)`` is called whenever events are enabled (now too, if they
        are on): it must record a ``BlockStored`` for every block its tier holds,
        then record its tier's changes into ``log``. ``attach(None)``, when they
        are disabled, must stop all its event work.
        """
        self._event_sources.append(attach)
        if self._pool.events is not None:
            attach(self._pool.events)

    def reset_prefix_cache(self, namespace: Namespace | None = None) -> bool:
        """Drops every prefix-cache entry; refused (False) while any block is in use. With ``namespace``
        (``jaxpaged.cache.namespaces``): drops only the entries of free blocks whose salt is in it, never
        refused; blocks in use keep theirs and other namespaces are untouched."""
        if namespace is None:
            return self._pool.reset_cache()
        self._pool.reset_namespace(check_namespace(namespace))
        return True

    def _set_in_flight(self, seq, window: tuple[int, int]) -> None:
        """Moves the sequence's in-flight hash window (allocated, hash-known, uncommitted blocks)."""
        self._in_flight.move_window(seq.block_hashes, seq.pending, window)
        seq.pending = window

    def num_computed_tokens(self, seq_id: Hashable) -> int:
        """Leading tokens of the sequence whose K/V are in the pool (committed)."""
        return self._seq(seq_id).num_computed

    def num_cached_tokens(self, seq_id: Hashable) -> int:
        """Tokens the sequence got from the prefix cache when it was admitted."""
        return self._seq(seq_id).num_cached_tokens

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    @property
    def stats(self) -> CacheStats:
        """A snapshot of occupancy (over the whole pool) and prefix-cache counters."""
        pool = self._pool
        return CacheStats(
            num_blocks=self.num_blocks,
            num_used_blocks=pool.num_used,
            num_free_blocks=pool.num_free,
            num_cached_blocks=len(pool.cached),
            num_sequences=len(self._seqs),
            usage=pool.num_used / self.num_blocks,
            prefix_queries_tokens=self._queries_tokens,
            prefix_hits_tokens=self._hits_tokens,
            num_evictions=pool.num_evictions,
            num_cow_copies=self._cow_copies,
            num_pinned_blocks=pool.num_pinned_blocks,
            evictions_by_reason=dict(pool.evictions_by_reason),
        )

    def cached_block_id(self, key: bytes) -> int | None:
        """The pool block that holds prefix-cache entry ``key`` (a group key), or None (read-only)."""
        block = self._pool.cached.get(key)
        return None if block is None else block.block_id

    def cached_blocks(self) -> list[CachedBlockInfo]:
        """Every prefix-cache entry, coldest first: evictable ones in eviction order, then in-use ones.

        Read-only; used to snapshot the cache (the block ids say where the K/V live).
        """
        evictable = [block for block in self._pool.free_queue if block.block_hash is not None]
        in_use = [block for block in self._pool.cached.values() if block.ref_count > 0]
        return [CachedBlockInfo(b.block_id, b.block_hash, b.parent_hash, b.token_ids, b.extra_keys, b.ref_count)
                for b in evictable + in_use]


def growth_error(seq_id: Hashable, num_new_tokens: int, start: int, num_committed: int, num_slots: int) -> ValueError:
    """The ValueError of an ``allocate_slots`` call that asks for the impossible."""
    if num_new_tokens < 0:
        return ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
    return ValueError(f"num_computed_tokens for {seq_id!r} must be in [{num_committed}, {num_slots}] "
                      f"(its committed tokens, its allocated slots), got {start}")
