"""The hybrid KV cache manager: one block table per KV cache group, sliding-window groups free old blocks.

For models with sliding-window layers (Gemma 3, Mistral): the layers form KV
cache groups (``jaxpaged.cache.kv_groups``), all drawing blocks from one
``BlockPool``. A sequence has one table per group, all of the same logical
length; the engine and runner see them interleaved in one flat table (entry
``j * G + g`` is group ``g``'s block for the ``j``-th ``block_size`` tokens),
so a ``BlockTableUpdate`` is a suffix of the flat table as before.

Rules, per group, as vLLM v1's ``SlidingWindowManager`` and
``HybridKVCacheCoordinator``:

- A sliding group (window W) drops its references to the blocks that lie
  wholly before ``num_computed - W + 1`` (no query to come can see them) when
  the sequence next grows; their table entries become null (``NULL_BLOCK``;
  the runner sends block 0, which attention never reads: the window skips it).
  A block published in the prefix cache stays there at ref 0, evictable.
- Each group has its own prefix-cache entries (a block id holds one group's
  layers); group ``g > 0`` keys the chained block hash with its group number.
- A prefix hit of L blocks needs the full groups to hold all L blocks and
  each sliding group the blocks covering the last W - 1 tokens before token
  ``L * block_size`` (the first one computed); the longest L every group can
  serve is found by shrinking it until all agree (full groups are
  prefix-closed, sliding ones are not).
- Admission, growth, copy-on-write and forks count and take blocks in every group.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from jaxpaged.cache.block_pool import BlockPool, KVBlock
from jaxpaged.cache.eviction import EvictionPolicy
from jaxpaged.cache.events import (DEVICE_TIER, BlockRemoved, BlockStored, KVEvent, KVEventLog,
                                   stored_in_chain_order)
from jaxpaged.cache.hashing import chain_block_hashes, digest_fn, request_extra_keys
from jaxpaged.cache.hybrid_invariants import check_hybrid_manager
from jaxpaged.cache.in_flight import InFlightHashes
from jaxpaged.cache.kv_groups import NULL_BLOCK, KVCacheLayout, group_key
from jaxpaged.cache.manager_queries import ManagerQueries, growth_error
from jaxpaged.cache.records import BlockTableUpdate, NO_CHANGE, PrefixMatch
from jaxpaged.mathutils import cdiv

PAD_BLOCK = 0  # what a null entry reads as in the flat table the runner gets


class _FromTier:
    """The type of :data:`FROM_TIER`."""

    def __repr__(self) -> str:
        return "FROM_TIER"


FROM_TIER = _FromTier()  # a matched entry a lower tier restores into a fresh block (see extend_match)


@dataclass
class HybridPrefixMatch(PrefixMatch):
    """A :class:`PrefixMatch` with each group's matched blocks (None where a sliding group needs none).

    After :meth:`HybridKVCacheManager.extend_match` the group lists run past
    ``num_cached_tokens`` (the device hit): their entries there are device
    blocks or :data:`FROM_TIER` (a fresh block the lower tier fills).
    """

    group_blocks: list[list[KVBlock | None | _FromTier]] = field(default_factory=list, repr=False,
                                                                 compare=False)
    num_extended_tokens: int = 0  # tokens the extended group lists make computed (0: not extended)


@dataclass
class MatchExtension:
    """A device match extended with lower-tier blocks (``HybridKVCacheManager.plan_extension``).

    ``group_blocks`` covers ``num_blocks`` positions per group; ``slots`` are the
    ``(index, group)`` entries that are :data:`FROM_TIER`, in flat-table order.
    ``num_tokens`` (a swapped-out sequence's computed length: its last block
    may be partial) defaults to ``num_blocks * block_size``.
    """

    num_blocks: int
    group_blocks: list[list[KVBlock | None | _FromTier]]
    slots: list[tuple[int, int]]
    num_tokens: int = 0


@dataclass
class HybridSequenceState:
    """One live sequence: a table per group plus the counters every group shares.

    ``skipped[g]``: leading table entries of group ``g`` that are null (slid out).
    Other fields as :class:`jaxpaged.cache.records.SequenceState`; ``pending``
    covers group 0's blocks.
    """

    tables: list[list[int]]
    skipped: list[int]
    num_computed: int
    num_cached_tokens: int
    block_hashes: list[bytes]
    num_hashed_blocks: int
    request_keys: tuple
    pending: tuple[int, int] = (0, 0)


class HybridKVCacheManager(ManagerQueries):
    """Block tables per KV cache group over one block pool; the ``KVManager`` protocol.

    ``max_chunk_tokens`` bounds the tokens one step computes for a sequence (the
    scheduler's token budget); with it a sliding group's share of a long
    sequence is bounded by ``W + chunk`` tokens when checking what can ever fit.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        layout: KVCacheLayout,
        *,
        enable_prefix_caching: bool = True,
        hash_algo: str = "sha256",
        max_chunk_tokens: int | None = None,
        eviction_policy: str | EvictionPolicy = "lru",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self._digest_len = len(digest_fn(hash_algo)(b""))  # raises ValueError for an unknown algorithm
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layout = layout
        self.windows = layout.windows
        self.num_groups = layout.num_groups
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_algo = hash_algo
        self.max_chunk_tokens = max_chunk_tokens
        self._pool = BlockPool(num_blocks, eviction_policy=eviction_policy, clock=clock)
        self._seqs: dict[Hashable, HybridSequenceState] = {}
        self._in_flight = InFlightHashes()
        self._queries_tokens = 0
        self._hits_tokens = 0
        self._cow_copies = 0
        self._num_slid_out = 0
        self._event_sources: list[Callable[[KVEventLog | None], None]] = []

    # ----------------------------------------------------------------- queries

    @property
    def num_slid_out_blocks(self) -> int:
        """Block references sliding groups have dropped so far because they fell out of the window."""
        return self._num_slid_out

    def max_blocks_for(self, num_tokens: int) -> int:
        """The most blocks (all groups) a sequence of ``num_tokens`` tokens holds at once."""
        bs, total = self.block_size, cdiv(num_tokens, self.block_size)
        chunk = self.max_chunk_tokens or num_tokens
        return sum(total if w is None else min(total, cdiv(w - 1 + chunk, bs) + 1) for w in self.windows)

    def can_fit(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens could ever fit the pool."""
        return self.max_blocks_for(num_tokens) <= self.num_blocks

    def block_table(self, seq_id: Hashable) -> list[int]:
        """The sequence's flat table: entry ``j * G + g`` is group ``g``'s ``j``-th block (slid out: 0)."""
        return _flat(self._seq(seq_id).tables, 0)

    def held_blocks(self, seq_id: Hashable) -> list[int]:
        """The block ids the sequence holds, every group, slid-out entries left out."""
        return [b for b in _flat(self._seq(seq_id).tables, NULL_BLOCK) if b != NULL_BLOCK]

    def group_block_tables(self, seq_id: Hashable) -> list[list[int]]:
        """A copy of each group's table (``NULL_BLOCK`` where a block slid out)."""
        return [list(table) for table in self._seq(seq_id).tables]

    def num_blocks_held(self, seq_id: Hashable) -> int:
        """Blocks the sequence holds over all groups (slid-out entries not counted)."""
        seq = self._seq(seq_id)
        return sum(len(table) - skipped for table, skipped in zip(seq.tables, seq.skipped))

    def _seq(self, seq_id: Hashable) -> HybridSequenceState:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise ValueError(
                f"sequence {seq_id!r} is not held by the cache manager (never allocated or already freed)")
        return seq

    def _check_fits(self, num_tokens: int, what: str) -> None:
        if not self.can_fit(num_tokens):
            raise ValueError(
                f"{what} of {num_tokens} tokens needs {self.max_blocks_for(num_tokens)} blocks over "
                f"{self.num_groups} KV cache groups of {self.block_size}-token blocks; "
                f"the pool has only {self.num_blocks}")

    def _first_needed(self, group: int, num_computed: int) -> int:
        """Index of the first block group ``group`` still needs once ``num_computed`` tokens are computed."""
        window = self.windows[group]
        return 0 if window is None else max(num_computed - window + 1, 0) // self.block_size

    # --------------------------------------------------------------- admission

    def match_prefix(self, token_ids: Sequence[int], *, cache_salt: str | None = None,
                     extra_keys: tuple = ()) -> HybridPrefixMatch:
        """The longest prefix of full blocks every group can serve (no side effects).

        Capped so at least one token is left to compute.
        """
        request_keys = request_extra_keys(cache_salt, extra_keys)
        num_tokens = len(token_ids)
        if not self.enable_prefix_caching:
            return HybridPrefixMatch([], 0, [], num_tokens=num_tokens, request_keys=request_keys,
                                     group_blocks=[[] for _ in range(self.num_groups)])
        hashes = chain_block_hashes(None, token_ids, self.block_size, request_keys, self.hash_algo)
        max_blocks = max(num_tokens - 1, 0) // self.block_size
        lookup = self._pool.cached.get
        hits = [[lookup(group_key(h, g)) for h in hashes[:max_blocks]] for g in range(self.num_groups)]
        length = self._longest_hit(hits, max_blocks)
        group_blocks = [[None if j < self._first_needed(g, length * self.block_size) else hits[g][j]
                         for j in range(length)] for g in range(self.num_groups)]
        num_pending = 0
        for index in range(length, max_blocks):
            if hashes[index] not in self._in_flight:
                break
            num_pending += 1
        matched = [b for blocks in group_blocks for b in blocks if b is not None]
        return HybridPrefixMatch(
            blocks=_flat([[PAD_BLOCK if b is None else b.block_id for b in blocks] for blocks in group_blocks],
                         PAD_BLOCK),
            num_cached_tokens=length * self.block_size, block_hashes=hashes,
            num_pending_tokens=num_pending * self.block_size, num_tokens=num_tokens,
            request_keys=request_keys, cache_epoch=self._pool.cache_epoch, matched=matched,
            group_blocks=group_blocks)

    def _longest_hit(self, hits: list[list[KVBlock | None]], max_blocks: int) -> int:
        """Largest L <= max_blocks that every group can serve (vLLM's coordinator fixpoint)."""
        length = max_blocks
        for g, window in enumerate(self.windows):
            if window is None:
                length = next((j for j in range(length) if hits[g][j] is None), length)
        changed = True
        while changed and length > 0:
            changed = False
            for g, window in enumerate(self.windows):
                if window is not None:
                    served = self._sliding_hit(hits[g], length, window)
                    changed |= served != length
                    length = served
        return length

    def _sliding_hit(self, hits: list[KVBlock | None], max_len: int, window: int) -> int:
        """Largest L <= max_len whose blocks from ``first_needed(L)`` to L - 1 are all cached."""
        bs = self.block_size
        missing_before = [0]  # missing_before[j]: uncached blocks among the first j
        for block in hits[:max_len]:
            missing_before.append(missing_before[-1] + (block is None))
        for length in range(max_len, 0, -1):
            first = max(length * bs - window + 1, 0) // bs
            if missing_before[length] == missing_before[first]:
                return length
        return 0

    def plan_extension(self, match: PrefixMatch, in_lower_tier: Callable[[bytes], bool],
                       max_blocks: int) -> MatchExtension | None:
        """How far a lower tier can extend a device match so that every group is served (no side effects).

        Each group's block at a position past the device hit comes from the
        device prefix cache while it is still there, else from the tier when
        ``in_lower_tier(group_key(hash, group))``. The longest length (at most
        ``max_blocks``) every group can serve is found by the same fixpoint as a
        device hit, and a sliding group gets only the blocks of its window before
        that length's first computed token: no restored block is one its layers
        would not hold. None when the tier adds nothing.
        """
        if not isinstance(match, HybridPrefixMatch) or not match.group_blocks:
            return None
        start, hashes = len(match.group_blocks[0]), match.block_hashes
        max_blocks = min(max_blocks, len(hashes))
        if max_blocks <= start:
            return None
        lookup = self._pool.cached.get
        device = [[lookup(group_key(h, g)) for h in hashes[start:max_blocks]] for g in range(self.num_groups)]
        served = [[True] * start + [True if block is not None or in_lower_tier(group_key(h, g)) else None
                                    for block, h in zip(device[g], hashes[start:max_blocks])]
                  for g in range(self.num_groups)]
        length = self._longest_hit(served, max_blocks)
        if length <= start:
            return None
        group_blocks, slots = [], []
        for g in range(self.num_groups):
            first = self._first_needed(g, length * self.block_size)
            entries: list[KVBlock | None | _FromTier] = [None] * min(first, length)
            for j in range(first, length):
                block = match.group_blocks[g][j] if j < start else device[g][j - start]
                entries.append(FROM_TIER if block is None else block)
                if block is None:
                    slots.append((j, g))
            group_blocks.append(entries)
        return MatchExtension(length, group_blocks, sorted(slots), length * self.block_size)

    def plan_swap_in(self, match: PrefixMatch, num_tokens: int,
                     swapped: set[tuple[int, int]]) -> MatchExtension | None:
        """The extension that brings a swapped-out sequence back to ``num_tokens`` computed tokens.

        ``swapped`` holds the ``(index, group)`` blocks the host kept. Each group
        needs what its next query sees (a sliding group its window before
        ``num_tokens``); positions before the device hit come from ``match``,
        later ones from the host. None when something needed is missing (the
        sequence is recomputed) or the device hit already covers it.
        """
        if not isinstance(match, HybridPrefixMatch) or not match.group_blocks:
            return None
        start, length = len(match.group_blocks[0]), cdiv(num_tokens, self.block_size)
        if num_tokens <= start * self.block_size:
            return None
        group_blocks, slots = [], []
        for g in range(self.num_groups):
            first = self._first_needed(g, num_tokens)
            entries: list[KVBlock | None | _FromTier] = [None] * min(first, length)
            for j in range(first, length):
                if j < start:
                    entries.append(match.group_blocks[g][j])
                elif (j, g) in swapped:
                    entries.append(FROM_TIER)
                    slots.append((j, g))
                else:
                    return None
            group_blocks.append(entries)
        return MatchExtension(length, group_blocks, sorted(slots), num_tokens)

    def apply_extension(self, match: HybridPrefixMatch, extension: MatchExtension) -> list[int]:
        """Extends ``match`` in place (pass it on to ``allocate_new``); returns the flat table index
        (``j * G + g``) of each block the tier fills, in ``extension.slots`` order.

        ``match.num_cached_tokens`` stays the device hit; ``allocate_new`` then
        admits the extended length as computed and publishes the restored blocks.
        """
        match.group_blocks = extension.group_blocks
        match.matched = [b for blocks in extension.group_blocks for b in blocks if isinstance(b, KVBlock)]
        match.num_extended_tokens = extension.num_tokens
        return [j * self.num_groups + g for j, g in extension.slots]

    def allocate_new(self, seq_id: Hashable, token_ids: Sequence[int], num_new_tokens: int,
                     match: PrefixMatch | None, *, cache_salt: str | None = None,
                     extra_keys: tuple = ()) -> bool:
        """Admits a sequence, all or nothing: its matched blocks in every group and fresh ones after.

        Raises:
          ValueError: as ``KVCacheManager.allocate_new`` (exists already, can never
            fit, ``num_new_tokens`` out of range, a match for other tokens or stale).
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} is already allocated")
        num_tokens = len(token_ids)
        if num_tokens == 0:
            raise ValueError(f"sequence {seq_id!r} has no tokens")
        self._check_fits(num_tokens, f"sequence {seq_id!r}")
        request_keys = request_extra_keys(cache_salt, extra_keys)
        if match is None or not isinstance(match, HybridPrefixMatch) or not match.group_blocks:
            if match is not None:
                self._check_match(match, num_tokens, request_keys)
            match = self._no_match(token_ids, request_keys)
        else:
            self._check_match(match, num_tokens, request_keys)
        num_cached = match.num_cached_tokens
        if not 0 <= num_new_tokens <= num_tokens - num_cached:
            raise ValueError(f"num_new_tokens must be in [0, {num_tokens - num_cached}] "
                             f"({num_tokens} tokens, {num_cached} cached), got {num_new_tokens}")
        num_matched = num_cached // self.block_size
        num_known = len(match.group_blocks[0])  # past num_matched: positions a lower tier extended
        total = cdiv(num_cached + num_new_tokens, self.block_size)
        if total < num_known:
            raise ValueError(f"num_new_tokens ({num_new_tokens}) must cover the {num_known - num_matched} "
                             "blocks the lower tier restores")
        num_restored = sum(1 for blocks in match.group_blocks for b in blocks if b is FROM_TIER)
        num_fresh = (total - num_known) * self.num_groups + num_restored
        num_revived = sum(1 for block in match.matched if block.ref_count == 0)
        if num_fresh > self._pool.num_free - num_revived:
            return False
        self._pool.take(match.matched)  # first, so allocating can't evict them
        fresh = iter(self._pool.allocate(num_fresh))
        tables, skipped = [], []
        for blocks in match.group_blocks:
            table = [NULL_BLOCK if b is None else next(fresh).block_id if b is FROM_TIER else b.block_id
                     for b in blocks]
            table += [next(fresh).block_id for _ in range(total - num_known)]
            tables.append(table)
            skipped.append(sum(1 for b in blocks if b is None))
        seq = HybridSequenceState(
            tables=tables, skipped=skipped, num_computed=num_cached, num_cached_tokens=num_cached,
            block_hashes=list(match.block_hashes), num_hashed_blocks=num_matched,
            request_keys=request_keys, pending=(num_matched, num_matched))
        self._seqs[seq_id] = seq
        if num_known > num_matched:  # restored (their K/V land before the step) and device-adopted blocks
            seq.num_computed = match.num_extended_tokens
            if self.enable_prefix_caching:
                self._publish_full_blocks(seq, token_ids, seq.num_computed // self.block_size)
        self._sync_in_flight(seq)
        if self.enable_prefix_caching:
            self._queries_tokens += num_tokens
            self._hits_tokens += num_cached
        return True

    def _no_match(self, token_ids: Sequence[int], request_keys: tuple) -> HybridPrefixMatch:
        hashes = []
        if self.enable_prefix_caching:
            hashes = chain_block_hashes(None, token_ids, self.block_size, request_keys, self.hash_algo)
        return HybridPrefixMatch([], 0, hashes, num_tokens=len(token_ids), request_keys=request_keys,
                                 group_blocks=[[] for _ in range(self.num_groups)])

    def _check_match(self, match: PrefixMatch, num_tokens: int, request_keys: tuple) -> None:
        if match.num_tokens != num_tokens or match.request_keys != request_keys:
            raise ValueError(
                f"PrefixMatch is for {match.num_tokens} tokens with keys {match.request_keys!r}, "
                f"not these {num_tokens} tokens with keys {request_keys!r}")
        if match.cache_epoch == self._pool.cache_epoch or not isinstance(match, HybridPrefixMatch):
            return
        for g, blocks in enumerate(match.group_blocks):
            for block, block_hash in zip(blocks, match.block_hashes):
                if isinstance(block, KVBlock) and block.block_hash != group_key(block_hash, g):
                    raise ValueError(
                        f"stale PrefixMatch: block {block.block_id} was evicted since match_prefix; "
                        "call match_prefix again right before allocate_new")

    # ------------------------------------------------------------------- growth

    def _slide(self, seq: HybridSequenceState) -> None:
        """Drops each sliding group's references to blocks no future query of the sequence can see."""
        blocks = self._pool.blocks
        for g, window in enumerate(self.windows):
            if window is None:
                continue
            first = self._first_needed(g, seq.num_computed)
            old = seq.skipped[g]
            if first <= old:
                continue
            table = seq.tables[g]
            self._pool.release([blocks[table[j]] for j in range(first - 1, old - 1, -1)])
            table[old:first] = [NULL_BLOCK] * (first - old)
            seq.skipped[g] = first
            self._num_slid_out += first - old

    def allocate_slots(self, seq_id: Hashable, num_new_tokens: int, *,
                       num_computed_tokens: int) -> BlockTableUpdate | None:
        """Room for ``num_new_tokens`` more tokens after the first ``num_computed_tokens`` (the caller's
        count: computed or being computed), in every group.

        First drops the blocks that slid out of each window (never needed again,
        so this happens even when the call then returns None for lack of blocks).
        Then as ``KVCacheManager.allocate_slots``: fresh blocks per group, and a
        private copy of a shared, partly written last block in each group that
        shares one. The update is a suffix of the flat table.
        """
        seq = self._seqs.get(seq_id) or self._seq(seq_id)
        start, bs, num_groups = num_computed_tokens, self.block_size, self.num_groups
        tables = seq.tables
        length = len(tables[0])
        if num_new_tokens < 0 or not seq.num_computed <= start <= length * bs:
            raise growth_error(seq_id, num_new_tokens, start, seq.num_computed, length * bs)
        self._slide(seq)
        end = start + num_new_tokens
        num_fresh = cdiv(end, bs) - length if end > length * bs else 0
        if num_fresh > 0:
            self._check_fits(end, f"sequence {seq_id!r} grown")
        blocks = self._pool.blocks
        cow_groups = []
        if num_new_tokens > 0 and start % bs:
            index = start // bs
            cow_groups = [g for g in range(num_groups) if blocks[tables[g][index]].ref_count > 1]
        if num_fresh <= 0 and not cow_groups:
            return NO_CHANGE
        num_fresh = max(num_fresh, 0)
        if num_fresh * num_groups + len(cow_groups) > self._pool.num_free:
            return None
        first_changed = length
        copies = []
        for g in cow_groups:
            index = start // bs
            shared = blocks[tables[g][index]]
            (private,) = self._pool.allocate(1)
            self._pool.release([shared])
            tables[g][index] = private.block_id
            copies.append((shared.block_id, private.block_id))
            first_changed = index
        self._cow_copies += len(copies)
        if num_fresh:
            fresh = iter(self._pool.allocate(num_fresh * num_groups))
            for j in range(num_fresh):
                for g in range(num_groups):
                    tables[g].append(next(fresh).block_id)
            if len(seq.block_hashes) > length:
                self._sync_in_flight(seq)
        flat = _flat([table[first_changed:] for table in tables], PAD_BLOCK)
        return BlockTableUpdate(first_changed * num_groups, flat, tuple(copies))

    def commit(self, seq_id: Hashable, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Records that the first ``num_computed_tokens`` of ``token_ids`` have K/V in every group.

        Newly full blocks are published in each group's prefix cache.

        Raises:
          ValueError: as ``KVCacheManager.commit``.
        """
        seq = self._seqs.get(seq_id) or self._seq(seq_id)
        old, new = seq.num_computed, num_computed_tokens
        bs, length = self.block_size, len(seq.tables[0])
        if not old <= new <= len(token_ids) or new > length * bs:
            limit = min(len(token_ids), length * bs)
            raise ValueError(
                f"num_computed_tokens for {seq_id!r} must be in [{old}, {limit}] "
                f"({len(token_ids)} tokens, {length} blocks per group allocated), got {new}")
        if new > old:
            blocks = self._pool.blocks
            for table in seq.tables:
                for index in range(old // bs, (new - 1) // bs + 1):
                    if blocks[table[index]].ref_count > 1:
                        raise ValueError(
                            f"sequence {seq_id!r} wrote into shared block {table[index]}; "
                            "call allocate_slots before the step so it is copied on write")
        seq.num_computed = new
        if self.enable_prefix_caching and new // bs > seq.num_hashed_blocks:
            self._publish_full_blocks(seq, token_ids, new // bs)

    def _publish_full_blocks(self, seq: HybridSequenceState, token_ids: Sequence[int], num_full: int) -> None:
        bs, hashes = self.block_size, seq.block_hashes
        start = len(hashes)
        if start < num_full:
            parent = hashes[-1] if hashes else None
            hashes += chain_block_hashes(parent, token_ids[start * bs:num_full * bs], bs,
                                         seq.request_keys if start == 0 else (), self.hash_algo)
        blocks, cache_block, log = self._pool.blocks, self._pool.cache_block, self._pool.events
        for index in range(seq.num_hashed_blocks, num_full):
            tokens = tuple(token_ids[index * bs:(index + 1) * bs])
            parent = hashes[index - 1] if index else None
            keys = seq.request_keys if index == 0 else ()
            for g, table in enumerate(seq.tables):
                if table[index] != NULL_BLOCK:
                    stored = cache_block(blocks[table[index]], group_key(hashes[index], g), parent, tokens, keys)
                    if stored and g == 0 and log is not None:
                        log.store(hashes[index], parent, tokens, bs, DEVICE_TIER)
        seq.num_hashed_blocks = num_full
        self._sync_in_flight(seq)

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Starts ``child_id`` sharing, in every group, the parent's blocks that hold computed tokens
        (once every scheduled token of the parent is committed, as ``KVCacheManager.fork``)."""
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"fork target {child_id!r} is already allocated")
        num_shared = cdiv(parent.num_computed, self.block_size)
        tables = [table[:num_shared] for table in parent.tables]
        blocks = self._pool.blocks
        self._pool.take([blocks[b] for table in tables for b in table if b != NULL_BLOCK])
        done = parent.num_hashed_blocks
        self._seqs[child_id] = HybridSequenceState(
            tables=tables, skipped=list(parent.skipped), num_computed=parent.num_computed,
            num_cached_tokens=parent.num_cached_tokens,
            block_hashes=parent.block_hashes[:done], num_hashed_blocks=done,
            request_keys=parent.request_keys, pending=(done, done))

    # ------------------------------------------------------------------ release

    def free(self, seq_id: Hashable) -> None:
        """Releases every block of the sequence in every group, deepest first."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        self._set_in_flight(seq, (seq.pending[1], seq.pending[1]))
        blocks = self._pool.blocks
        self._pool.release([blocks[b] for b in reversed(_flat(seq.tables, NULL_BLOCK)) if b != NULL_BLOCK])

    def cache_restored_blocks(self, entries: Sequence[tuple[bytes, bytes | None, tuple[int, ...], tuple]]
                              ) -> list[int | None]:
        """Publishes blocks from a snapshot at ref count 0, coldest first, in empty pool blocks only.

        ``entries`` are ``(key, parent_hash, token_ids, extra_keys)`` with the
        key a group key (:func:`group_key`). Nothing cached is evicted. Returns
        each entry's block id, whose K/V the caller writes before the next step;
        None where the key is cached already or no empty block is left.
        """
        pool, log, out = self._pool, self._pool.events, []
        for key, parent, tokens, keys in entries:
            if key in pool.cached or not len(pool.empty):
                out.append(None)
                continue
            (block,) = pool.allocate(1)  # an empty block: nothing is evicted
            pool.cache_block(block, key, parent, tuple(tokens), keys)
            if log is not None and len(key) == self._digest_len:
                log.store(key, parent, tuple(tokens), self.block_size, DEVICE_TIER)
            pool.release([block])
            out.append(block.block_id)
        return out

    # ------------------------------------------------------------------- events

    def enable_events(self, *, include_token_ids: bool = False) -> KVEventLog:
        """Records group 0's prefix-cache events (the plain chained hashes) of every tier; returns the log.

        Group 0 is the full-attention group when the model has one (else the only
        sliding one), so a router mirroring these events knows which prefixes the
        engine holds every block of; the sliding groups' entries (device or lower
        tier) are keyed per group and stay out of the log. Starts with a
        ``BlockStored`` per cached block, then each lower tier's (``add_event_source``).
        """
        log = _GroupZeroEventLog(self._digest_len, include_token_ids=include_token_ids)
        entries = [(b.block_hash, b.parent_hash, b.token_ids) for b in self.cached_blocks()
                   if len(b.block_hash) == self._digest_len]
        for event in stored_in_chain_order(entries, self.block_size, DEVICE_TIER,
                                           include_token_ids=include_token_ids):
            log.append(event)
        self._pool.events = log
        for attach in self._event_sources:
            attach(log)
        return log

    # ---------------------------------------------------------- in-flight blocks

    def _sync_in_flight(self, seq: HybridSequenceState) -> None:
        start = seq.num_hashed_blocks
        end = max(start, min(len(seq.tables[0]), len(seq.block_hashes)))
        if (start, end) != seq.pending:
            self._set_in_flight(seq, (start, end))

    def check_invariants(self) -> None:
        """Checks every bookkeeping rule, per group, in O(pool + tables); raises AssertionError."""
        check_hybrid_manager(self)


class _GroupZeroEventLog(KVEventLog):
    """An event log that keeps only group 0's keys: the group-tagged keys of groups > 0 make no event.

    Tagged keys are longer than a plain chained hash; the device eviction hook
    and the lower tiers (which hold every group's blocks) record through here.
    """

    def __init__(self, digest_len: int, *, include_token_ids: bool) -> None:
        super().__init__(include_token_ids=include_token_ids)
        self._digest_len = digest_len  # a plain chained hash's length; tagged keys are longer

    def append(self, event: KVEvent) -> None:
        """Records ``event`` with the tagged hashes of stored or removed blocks left out (dropped if none are left).

        A tagged key is never a parent (every key's parent is a plain hash), so
        in a stored run it can only come last: the run is cut before it.
        """
        if isinstance(event, BlockRemoved):
            hashes = tuple(h for h in event.block_hashes if len(h) == self._digest_len)
            event = dataclasses.replace(event, block_hashes=hashes)
        elif isinstance(event, BlockStored):
            keep = next((i for i, h in enumerate(event.block_hashes) if len(h) != self._digest_len),
                        len(event.block_hashes))
            tokens = event.token_ids
            event = dataclasses.replace(event, block_hashes=event.block_hashes[:keep],
                                        token_ids=None if tokens is None else tokens[:keep * event.block_size])
        if isinstance(event, (BlockStored, BlockRemoved)) and not event.block_hashes:
            return
        super().append(event)

    def remove(self, block_hash: bytes, tier: str) -> None:
        """Records a removed group-0 hash; other groups' removals make no event."""
        if len(block_hash) == self._digest_len:
            super().remove(block_hash, tier)


def _flat(tables: Sequence[Sequence[int]], null: int) -> list[int]:
    """Interleave per-group tables of equal length: entry ``j * G + g`` is ``tables[g][j]``."""
    return [null if b == NULL_BLOCK else b for column in zip(*tables) for b in column]
