"""The host-side controller that decides which physical block holds which tokens.

Life of a sequence, as the engine drives it::

    m = mgr.match_prefix(prompt)                      # no side effects
    if mgr.allocate_new(seq, prompt, n, m):           # atomic: all or nothing
        ...device step writes tokens [m.num_cached_tokens, +n) ...
        mgr.commit(seq, prompt, m.num_cached_tokens + n)
    while running:
        update = mgr.allocate_slots(seq, 1, num_computed_tokens=n)   # None: preempt someone
        ...device makes update.copies, then writes one token...
        mgr.commit(seq, tokens, n + 1); n += 1
    mgr.free(seq)

One manager for every model, as vLLM v1's ``KVCacheManager``: the layers form
KV cache groups (``jaxpaged.cache.kv_groups``; a plain model is one
full-attention group), all drawing blocks from one ``BlockPool``. A sequence
has one table per group, all of the same logical length; the engine and
runner see them interleaved in one flat table (entry ``j * G + g`` is group
``g``'s block for the ``j``-th ``block_size`` tokens; with one group, the
table itself), so a ``BlockTableUpdate`` is a suffix of the flat table. What
differs between attention types is asked of the ``KVCacheCoordinator`` and its
single-type managers: the longest prefix hit every group serves, what can ever
fit, which leading blocks a sliding group drops (its table entries become
``NULL_BLOCK``; the runner sends block 0, which attention never reads). Each
group has its own prefix-cache entries (a block id holds one group's layers):
group 0 keys by the plain chained hash, group ``g > 0`` tags it with ``g``.

Growth starts after the tokens the caller has already *scheduled*, not only the
committed ones, so the next step can be allocated while the current one still
runs (asynchronous scheduling): ``allocate_slots`` twice, then ``commit`` twice.
That count (committed plus in flight) has one owner, the caller (the
scheduler's ``Sequence.num_computed_tokens``, as vLLM v1's
``Request.num_computed_tokens``); the manager keeps only what is committed.

Contract: the token ids passed to ``commit`` start with the ones given to
``allocate_new`` (prompt hashes computed at admission are reused, not
re-derived), and every write goes through ``allocate_slots`` first, which is
where copy-on-write happens. Blocks computed elsewhere (a lower tier, a
swapped-out copy) enter only through an extended match (``plan_extension`` /
``plan_swap_in``, then ``apply_extension``) passed to ``allocate_new``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence

from jaxpaged.cache.block_pool import BlockPool, KVBlock
from jaxpaged.cache.eviction import EvictionPolicy
from jaxpaged.cache.events import (DEVICE_TIER, BlockStored, GroupZeroEventLog, KVEventLog,
                                   stored_in_chain_order)
from jaxpaged.cache.hashing import chain_block_hashes, digest_fn, next_block_hasher, request_extra_keys
from jaxpaged.cache.in_flight import InFlightHashes
from jaxpaged.cache.invariants import check_manager
from jaxpaged.cache.kv_cache_coordinator import FROM_TIER, KVCacheCoordinator, MatchExtension
from jaxpaged.cache.kv_groups import NULL_BLOCK, PAD_BLOCK, KVCacheLayout, interleave_tables, kv_cache_layout
from jaxpaged.cache.manager_queries import ManagerQueries, growth_error
from jaxpaged.cache.namespaces import salt_of
from jaxpaged.cache.records import NO_CHANGE, BlockTableUpdate, PrefixMatch, SequenceState
from jaxpaged.mathutils import cdiv

_ONE_FULL_GROUP = kv_cache_layout((None,))  # a plain model: one full-attention group


class KVCacheManager(ManagerQueries):
    """Block tables per KV cache group over one block pool, ref counts, copy-on-write and prefix caching.

    Pure Python: it never touches device arrays. It tells the engine which blocks
    a sequence owns (``block_table``) and which blocks to copy before a step.
    ``layout`` (default: one full-attention group) names the groups;
    ``max_chunk_tokens`` bounds the tokens one step computes for a sequence,
    which bounds a sliding group's share of a long sequence.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        layout: KVCacheLayout | None = None,
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
        self.layout = layout or _ONE_FULL_GROUP
        self.windows = self.layout.windows
        self.num_groups = self.layout.num_groups
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_algo = hash_algo
        self.max_chunk_tokens = max_chunk_tokens
        self._coordinator = KVCacheCoordinator(self.layout, block_size, max_chunk_tokens)
        self._unitary = self._coordinator.unitary
        self._sliding = self._coordinator.sliding
        self._hash_next_block = next_block_hasher(block_size, hash_algo)
        self._pool = BlockPool(num_blocks, eviction_policy=eviction_policy, clock=clock)
        self._seqs: dict[Hashable, SequenceState] = {}
        self._in_flight = InFlightHashes()
        self._queries_tokens = 0
        self._hits_tokens = 0
        self._cow_copies = 0
        self._num_slid_out = 0
        self._event_sources: list[Callable[[KVEventLog | None], None]] = []

    # ----------------------------------------------------------------- queries

    def _seq(self, seq_id: Hashable) -> SequenceState:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise ValueError(
                f"sequence {seq_id!r} is not held by the cache manager (never allocated or already freed)")
        return seq

    def _check_fits(self, num_tokens: int, what: str) -> None:
        if not self.can_fit(num_tokens):
            groups = f" over {self.num_groups} KV cache groups" if self.num_groups > 1 else ""
            raise ValueError(
                f"{what} of {num_tokens} tokens needs {self.max_blocks_for(num_tokens)} blocks{groups} "
                f"of {self.block_size} tokens; the pool has only {self.num_blocks}")

    # --------------------------------------------------------------- admission

    def match_prefix(self, token_ids: Sequence[int], *, cache_salt: str | None = None,
                     extra_keys: tuple = ()) -> PrefixMatch:
        """The longest prefix of full blocks every group can serve (no side effects).

        Capped so at least one token is left to compute.
        """
        request_keys = request_extra_keys(cache_salt, extra_keys)
        num_tokens = len(token_ids)
        if not self.enable_prefix_caching:
            return PrefixMatch([], 0, [], num_tokens=num_tokens, request_keys=request_keys,
                               group_blocks=[[] for _ in range(self.num_groups)])
        hashes = chain_block_hashes(None, token_ids, self.block_size, request_keys, self.hash_algo)
        max_blocks = max(num_tokens - 1, 0) // self.block_size
        length, group_blocks = self._coordinator.find_longest_cache_hit(self._pool.cached.get, hashes, max_blocks)
        num_pending = 0
        for index in range(length, max_blocks):
            if hashes[index] not in self._in_flight:
                break
            num_pending += 1
        if self._unitary:
            matched = group_blocks[0]
            flat = [block.block_id for block in matched]
        else:
            matched = [b for blocks in group_blocks for b in blocks if b is not None]
            ids = [[PAD_BLOCK if b is None else b.block_id for b in blocks] for blocks in group_blocks]
            flat = interleave_tables(ids, PAD_BLOCK)
        return PrefixMatch(
            blocks=flat, num_cached_tokens=length * self.block_size, block_hashes=hashes,
            num_pending_tokens=num_pending * self.block_size, num_tokens=num_tokens,
            request_keys=request_keys, cache_epoch=self._pool.cache_epoch, matched=matched,
            group_blocks=group_blocks)

    def plan_extension(self, match: PrefixMatch, in_lower_tier: Callable[[bytes], bool],
                       max_blocks: int) -> MatchExtension | None:
        """How far a lower tier (``in_lower_tier(key)``) can extend ``match`` to at most ``max_blocks``
        blocks with every group served (no side effects; ``KVCacheCoordinator.plan_extension``)."""
        return self._coordinator.plan_extension(match, self._pool.cached.get, in_lower_tier, max_blocks)

    def plan_swap_in(self, match: PrefixMatch, num_tokens: int,
                     swapped: set[tuple[int, int]]) -> MatchExtension | None:
        """The extension that brings a swapped-out sequence back to ``num_tokens`` computed tokens from the
        ``(index, group)`` blocks kept in ``swapped`` (``KVCacheCoordinator.plan_swap_in``)."""
        return self._coordinator.plan_swap_in(match, num_tokens, swapped)

    def apply_extension(self, match: PrefixMatch, extension: MatchExtension) -> list[int]:
        """Extends ``match`` in place (pass it on to ``allocate_new``); returns the flat table index
        (``j * G + g``) of each block the tier fills, in ``extension.slots`` order.

        ``match.num_cached_tokens`` stays the device hit; ``allocate_new`` then
        admits the extended length as computed and publishes the restored blocks.
        """
        match.group_blocks = extension.group_blocks
        match.matched = [b for blocks in extension.group_blocks for b in blocks
                         if b is not None and b is not FROM_TIER]  # pool blocks: not slid out, not a tier's
        match.num_extended_tokens = extension.num_tokens
        return [j * self.num_groups + g for j, g in extension.slots]

    def allocate_new(
        self,
        seq_id: Hashable,
        token_ids: Sequence[int],
        num_new_tokens: int,
        match: PrefixMatch | None,
        *,
        cache_salt: str | None = None,
        extra_keys: tuple = (),
        count_query: bool = True,
    ) -> bool:
        """Admits a new (or resumed) sequence, all or nothing.

        Takes the matched blocks in every group (a cached free block is revived
        from the free queue) and enough fresh blocks for
        ``match.num_cached_tokens + num_new_tokens`` tokens; an extended match's
        ``FROM_TIER`` entries get fresh blocks too and count as computed.
        Returns False, changing nothing, when the pool has too few free blocks
        now. ``match=None`` skips the prefix cache lookup; ``count_query=False``
        leaves the hit-rate counters alone (a sequence that must not use hits,
        e.g. one that needs its prompt's logits).

        Raises:
          ValueError: the sequence exists already, could never fit the pool,
            ``num_new_tokens`` is out of range (or short of an extension), or
            ``match`` is for other tokens or stale (one of its blocks was
            evicted since ``match_prefix``).
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} is already allocated")
        num_tokens = len(token_ids)
        if num_tokens == 0:
            raise ValueError(f"sequence {seq_id!r} has no tokens")
        self._check_fits(num_tokens, f"sequence {seq_id!r}")
        request_keys = request_extra_keys(cache_salt, extra_keys)
        if match is not None:
            self._check_match(match, num_tokens, request_keys)
        if match is None or not match.group_blocks:  # no lookup: every block is fresh
            match = None
            hashes = []
            if self.enable_prefix_caching:
                hashes = chain_block_hashes(None, token_ids, self.block_size, request_keys, self.hash_algo)
            num_cached = num_known = num_extended = 0
            matched = ()
        else:
            hashes = list(match.block_hashes)
            num_cached, num_known = match.num_cached_tokens, len(match.group_blocks[0])
            num_extended, matched = match.num_extended_tokens, match.matched
        if not 0 <= num_new_tokens <= num_tokens - num_cached:
            raise ValueError(f"num_new_tokens must be in [0, {num_tokens - num_cached}] "
                             f"({num_tokens} tokens, {num_cached} cached), got {num_new_tokens}")
        bs = self.block_size
        num_matched = num_cached // bs
        total = cdiv(num_cached + num_new_tokens, bs)
        if total < num_known:  # past num_matched: positions an extension filled
            raise ValueError(f"num_new_tokens ({num_new_tokens}) must cover the {num_known - num_matched} "
                             "blocks the lower tier restores")
        num_fresh = (total - num_known) * self.num_groups
        if num_extended:
            num_fresh += sum(1 for blocks in match.group_blocks for b in blocks if b is FROM_TIER)
        # Reviving a cached free block takes it out of the free count too. Most of
        # the time the worst case (every match revived) fits and counting is skipped.
        if num_fresh > self._pool.num_free - len(matched):
            num_revived = sum(1 for block in matched if block.ref_count == 0)
            if num_fresh > self._pool.num_free - num_revived:
                return False
        self._pool.take(matched)  # first, so allocating can't evict them
        fresh = [block.block_id for block in self._pool.allocate(num_fresh)]
        tables, skipped = self._admitted_tables(match, fresh, total - num_known)
        seq = SequenceState(
            tables=tables, skipped=skipped, num_computed=num_cached, num_cached_tokens=num_cached,
            block_hashes=hashes, num_hashed_blocks=num_matched,
            request_keys=request_keys, pending=(num_matched, num_matched))
        self._seqs[seq_id] = seq
        if num_known > num_matched:  # restored (their K/V land before the step) and device-adopted blocks
            seq.num_computed = num_extended
            if self.enable_prefix_caching:
                self._publish_full_blocks(seq, token_ids, num_extended // bs)
        self._sync_in_flight(seq)
        if self.enable_prefix_caching and count_query:
            self._queries_tokens += num_tokens
            self._hits_tokens += num_cached
        return True

    def _admitted_tables(self, match: PrefixMatch | None, fresh: list[int],
                         num_after: int) -> tuple[list[list[int]], list[int]]:
        """A new sequence's tables and null-run lengths: each group's matched entries (``FROM_TIER`` ones
        take fresh blocks), then ``num_after`` fresh blocks; ``fresh`` is used group after group."""
        num_groups = self.num_groups
        if match is None:
            if num_groups == 1:
                return [fresh], [0]
            return [fresh[g * num_after:(g + 1) * num_after] for g in range(num_groups)], [0] * num_groups
        if self._unitary and not match.num_extended_tokens:  # matched blocks, then fresh ones
            return [match.blocks + fresh], [0]
        fresh_ids = iter(fresh)
        tables, skipped = [], []
        for blocks in match.group_blocks:
            table = [NULL_BLOCK if b is None else next(fresh_ids) if b is FROM_TIER else b.block_id
                     for b in blocks]
            table += [next(fresh_ids) for _ in range(num_after)]
            tables.append(table)
            skipped.append(sum(1 for b in blocks if b is None))
        return tables, skipped

    def _check_match(self, match: PrefixMatch, num_tokens: int, request_keys: tuple) -> None:
        if match.num_tokens != num_tokens or match.request_keys != request_keys:
            raise ValueError(
                f"PrefixMatch is for {match.num_tokens} tokens with keys {match.request_keys!r}, "
                f"not these {num_tokens} tokens with keys {request_keys!r}")
        if match.cache_epoch == self._pool.cache_epoch:
            return  # no hash entry has disappeared since the match: all still valid
        for manager, blocks in zip(self._coordinator.managers, match.group_blocks):
            for block, block_hash in zip(blocks, match.block_hashes):
                if block is not None and block is not FROM_TIER and block.block_hash != manager.key(block_hash):
                    raise ValueError(
                        f"stale PrefixMatch: block {block.block_id} was evicted since match_prefix; "
                        "call match_prefix again right before allocate_new")

    # ------------------------------------------------------------------- growth

    def _slide(self, seq: SequenceState) -> None:
        """Drops each sliding group's references to blocks no future query of the sequence can see."""
        blocks = self._pool.blocks
        for manager in self._sliding:
            g = manager.group
            first = manager.first_needed(seq.num_computed)
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
        """Makes room for the sequence to write ``num_new_tokens`` more tokens after its first
        ``num_computed_tokens`` (computed or being computed by steps in flight: the caller's count),
        in every group.

        First drops the blocks that slid out of each window (never needed again,
        so this happens even when the call then returns None for lack of
        blocks). Allocates blocks lazily. If the first block to be written is
        shared and already holds tokens, it is replaced by a private copy (in
        each group that shares it). Returns what changed in the flat block table
        (``NO_CHANGE`` when the last block has room), including the
        ``(src, dst)`` block copies the device must make first; or None,
        changing nothing else, when there are too few free blocks.

        Raises:
          ValueError: unknown sequence, negative count, a start before the
            committed tokens or past the allocated slots, or a length that
            could never fit the pool.
        """
        seq = self._seqs.get(seq_id) or self._seq(seq_id)  # once per sequence per step: no extra call
        start, bs, tables = num_computed_tokens, self.block_size, seq.tables
        table = tables[0]
        length = len(table)
        if num_new_tokens < 0 or not seq.num_computed <= start <= length * bs:
            raise growth_error(seq_id, num_new_tokens, start, seq.num_computed, length * bs)
        end = start + num_new_tokens
        num_fresh = cdiv(end, bs) - length if end > length * bs else 0
        # Only a partly written block can be shared and written: fork shares
        # blocks that hold computed tokens, and full blocks are never written.
        writes_partial_block = num_new_tokens > 0 and start % bs
        blocks = self._pool.blocks
        if self._unitary:
            cow_groups = (0,) if writes_partial_block and blocks[table[start // bs]].ref_count > 1 else ()
        else:
            if self._sliding:
                self._slide(seq)
            index = start // bs
            cow_groups = [g for g, t in enumerate(tables)
                          if writes_partial_block and blocks[t[index]].ref_count > 1]
        if num_fresh > 0:
            self._check_fits(end, f"sequence {seq_id!r} grown")
        if num_fresh <= 0 and not cow_groups:
            return NO_CHANGE  # the common decode step: room left in the last block
        num_fresh = max(num_fresh, 0)
        num_groups = self.num_groups
        if num_fresh * num_groups + len(cow_groups) > self._pool.num_free:
            return None
        first_changed, copies = length, ()
        if cow_groups:
            first_changed = start // bs
            copies = self._copy_on_write(tables, cow_groups, first_changed)
        if num_fresh:
            fresh = self._pool.allocate(num_fresh * num_groups)
            if num_groups == 1:
                tables[0].extend([block.block_id for block in fresh])
            else:
                for j in range(num_fresh):
                    for g in range(num_groups):
                        tables[g].append(fresh[j * num_groups + g].block_id)
            if len(seq.block_hashes) > length:  # prompt blocks with known hashes just got slots
                self._sync_in_flight(seq)
        if self._unitary:
            return BlockTableUpdate(first_changed, tables[0][first_changed:], copies)
        flat = interleave_tables([table[first_changed:] for table in tables], PAD_BLOCK)
        return BlockTableUpdate(first_changed * num_groups, flat, copies)

    def release_slots_after(self, seq_id: Hashable, num_tokens: int) -> int:
        """Frees, in every group, the blocks past the first ``num_tokens`` slots; returns how many blocks.

        Speculative decoding's rollback: ``allocate_slots`` gave the draft tokens
        slots before the step; once the step is verified the sequence keeps only
        the slots of its accepted tokens (``num_tokens``, its rewound computed
        count). The blocks released were never committed, so never hashed or
        cached: they go straight back to the free queue. A partly filled last
        block is kept; its rejected slots are masked by the context length and
        overwritten by the next write.

        Raises:
          ValueError: unknown sequence, or ``num_tokens`` before the committed tokens.
        """
        seq = self._seq(seq_id)
        if num_tokens < seq.num_computed:
            raise ValueError(f"release_slots_after({seq_id!r}, {num_tokens}): the sequence has "
                             f"{seq.num_computed} committed tokens; their slots cannot be released")
        keep = cdiv(num_tokens, self.block_size)
        if keep >= len(seq.tables[0]):
            return 0
        blocks = self._pool.blocks
        dropped = [blocks[b] for table in seq.tables for b in reversed(table[keep:]) if b != NULL_BLOCK]
        for table in seq.tables:
            del table[keep:]
        self._pool.release(dropped)
        self._sync_in_flight(seq)
        return len(dropped)

    def _copy_on_write(self, tables: list[list[int]], groups: Sequence[int],
                       index: int) -> tuple[tuple[int, int], ...]:
        """Replaces block ``index`` of each of these groups' tables (shared, about to be written) by a private
        block; returns the ``(src, dst)`` copies the device makes before the step."""
        blocks, copies = self._pool.blocks, []
        for g in groups:
            shared = blocks[tables[g][index]]
            (private,) = self._pool.allocate(1)
            self._pool.release([shared])
            tables[g][index] = private.block_id
            copies.append((shared.block_id, private.block_id))
        self._cow_copies += len(copies)
        return tuple(copies)

    def commit(self, seq_id: Hashable, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Records that the first ``num_computed_tokens`` of ``token_ids`` now have K/V in every group.

        Every newly full block is hashed (chained) and published in each
        group's prefix cache, generated tokens included. A block whose key is
        already cached elsewhere stays private to this sequence.

        Raises:
          ValueError: unknown sequence; a count that goes backwards, exceeds the
            tokens given or the slots allocated; or a write into a block still
            shared with another sequence (``allocate_slots`` was skipped).
        """
        seq = self._seqs.get(seq_id) or self._seq(seq_id)  # once per sequence per step: no extra call
        old, new = seq.num_computed, num_computed_tokens
        bs, tables = self.block_size, seq.tables
        table = tables[0]
        if not old <= new <= len(token_ids) or new > len(table) * bs:
            limit = min(len(token_ids), len(table) * bs)
            per_group = " per group" if self.num_groups > 1 else ""
            raise ValueError(
                f"num_computed_tokens for {seq_id!r} must be in [{old}, {limit}] "
                f"({len(token_ids)} tokens, {len(table)} blocks{per_group} allocated), got {new}")
        if new > old:
            blocks = self._pool.blocks
            for index in range(old // bs, (new - 1) // bs + 1):
                if blocks[table[index]].ref_count > 1:
                    raise _shared_write_error(seq_id, table[index])
            if len(tables) > 1:  # the other groups' blocks too (a slid-out block is never written)
                for table in tables[1:]:
                    for index in range(old // bs, (new - 1) // bs + 1):
                        if blocks[table[index]].ref_count > 1:
                            raise _shared_write_error(seq_id, table[index])
        seq.num_computed = new
        if self.enable_prefix_caching and new // bs > seq.num_hashed_blocks:
            self._publish_full_blocks(seq, token_ids, new // bs)

    def _publish_full_blocks(self, seq: SequenceState, token_ids: Sequence[int], num_full: int) -> None:
        bs = self.block_size
        hashes = seq.block_hashes
        start = len(hashes)
        if start and num_full == start + 1:  # one generated block filled: the decode step
            hashes.append(self._hash_next_block(hashes[-1], token_ids[start * bs : num_full * bs]))
        elif start < num_full:  # blocks past the prompt: hash from the real tokens
            parent = hashes[-1] if hashes else None
            first_keys = seq.request_keys if start == 0 else ()
            hashes += chain_block_hashes(
                parent, token_ids[start * bs : num_full * bs], bs, first_keys, self.hash_algo)
        if self._unitary and self._pool.events is None:
            blocks, table, cache_block = self._pool.blocks, seq.tables[0], self._pool.cache_block
            salt = salt_of(seq.request_keys)
            for index in range(seq.num_hashed_blocks, num_full):
                cache_block(blocks[table[index]], hashes[index], hashes[index - 1] if index else None,
                            tuple(token_ids[index * bs : (index + 1) * bs]),
                            seq.request_keys if index == 0 else (), salt)
        else:
            self._publish_in_groups(seq, token_ids, num_full)
        seq.num_hashed_blocks = num_full
        self._sync_in_flight(seq)

    def _publish_in_groups(self, seq: SequenceState, token_ids: Sequence[int], num_full: int) -> None:
        """``_publish_full_blocks``' caching loop over every group, recording (when events are on) one
        ``BlockStored`` per run of group 0's stored blocks.

        Group 0 keys by the plain hash. A group-0 block whose hash was cached
        already (or slid out) stays private and breaks the run; other groups'
        keys make no event.
        """
        bs, hashes, log = self.block_size, seq.block_hashes, self._pool.events
        blocks, cache_block, table = self._pool.blocks, self._pool.cache_block, seq.tables[0]
        others = list(zip(self._coordinator.managers[1:], seq.tables[1:]))
        salt = salt_of(seq.request_keys)
        run: list[int] = []

        def flush() -> None:
            if run:
                first, last = run[0], run[-1] + 1
                tokens = tuple(token_ids[first * bs : last * bs]) if log.include_token_ids else None
                log.append(BlockStored(tuple(hashes[first:last]), hashes[first - 1] if first else None,
                                       tokens, bs))
                run.clear()

        for index in range(seq.num_hashed_blocks, num_full):
            block_tokens = tuple(token_ids[index * bs : (index + 1) * bs])
            parent = hashes[index - 1] if index else None
            keys = seq.request_keys if index == 0 else ()
            stored = table[index] != NULL_BLOCK and cache_block(
                blocks[table[index]], hashes[index], parent, block_tokens, keys, salt)
            for manager, other in others:
                if other[index] != NULL_BLOCK:
                    cache_block(blocks[other[index]], manager.key(hashes[index]), parent, block_tokens, keys,
                                salt)
            if log is None:
                continue
            if stored:
                run.append(index)
            else:
                flush()
        if log is not None:
            flush()

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Starts ``child_id`` sharing, in every group, each parent block that holds computed tokens.

        Blocks allocated but not yet written stay the parent's alone, so the two
        can never write the same slot; the shared partly filled block is copied on
        the first write by either. The caller forks only once every scheduled
        token of the parent is committed (a step in flight would still write
        into a block the child now shares); the child's count of computed
        tokens starts at ``num_computed_tokens(parent_id)``.
        """
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"fork target {child_id!r} is already allocated")
        num_shared = cdiv(parent.num_computed, self.block_size)
        tables = [table[:num_shared] for table in parent.tables]
        blocks = self._pool.blocks
        self._pool.take([blocks[b] for table in tables for b in table if b != NULL_BLOCK])
        done = parent.num_hashed_blocks
        self._seqs[child_id] = SequenceState(
            tables=tables, skipped=list(parent.skipped), num_computed=parent.num_computed,
            num_cached_tokens=parent.num_cached_tokens,
            # Hashes past the computed blocks came from the parent's tokens; the
            # child's may differ there, so it re-derives them from its own.
            block_hashes=parent.block_hashes[:done], num_hashed_blocks=done,
            request_keys=parent.request_keys, pending=(done, done))

    # ------------------------------------------------------------------ release

    def free(self, seq_id: Hashable) -> None:
        """Releases every block of the sequence in every group, deepest first (so deepest is evicted first).

        Raises:
          ValueError: the sequence is unknown or was already freed.
        """
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        self._set_in_flight(seq, (seq.pending[1], seq.pending[1]))
        blocks = self._pool.blocks
        if self._unitary:
            self._pool.release([blocks[b] for b in reversed(seq.tables[0])])
        else:
            held = interleave_tables(seq.tables, NULL_BLOCK)
            self._pool.release([blocks[b] for b in reversed(held) if b != NULL_BLOCK])

    def cache_restored_blocks(self, entries: Sequence[tuple[bytes, bytes | None, tuple[int, ...], tuple]]
                              ) -> list[int | None]:
        """Publishes blocks from a snapshot at ref count 0, coldest first, in empty pool blocks only.

        ``entries`` are ``(key, parent_hash, token_ids, extra_keys)`` with the
        key a group key (``kv_groups.group_key``). Nothing cached is evicted.
        Returns each entry's block id, whose K/V the caller writes before the
        next step; None where the key is cached already or no empty block is left.
        A block's cache salt is its chain's: block 0's, found through the parents
        among ``entries`` and the blocks cached already.
        """
        pool, log, out = self._pool, self._pool.events, []
        salts = _chain_salts(entries, pool.cached)
        for key, parent, tokens, keys in entries:
            if key in pool.cached or not len(pool.empty):
                out.append(None)
                continue
            (block,) = pool.allocate(1)  # an empty block: nothing is evicted
            pool.cache_block(block, key, parent, tuple(tokens), keys, salts.get(key))
            if log is not None and len(key) == self._digest_len:
                log.store(key, parent, tuple(tokens), self.block_size, DEVICE_TIER)
            pool.release([block])
            out.append(block.block_id)
        return out

    # ------------------------------------------------------------------- events

    def enable_events(self, *, include_token_ids: bool = False) -> KVEventLog:
        """Starts recording group 0's prefix-cache events (the plain chained hashes) of every tier; returns the log.

        Group 0 is the full-attention group when the model has one (else the
        only sliding one), so a router mirroring these events knows which
        prefixes the engine holds every block of; other groups' entries (device
        or lower tier) are keyed per group and stay out of the log. The log
        starts with a ``BlockStored`` for every block already cached (device
        first, then each lower tier added with :meth:`add_event_source`),
        parents before children, so replaying it from here mirrors each tier
        even when blocks were cached before (a snapshot restore, a router that
        attaches late). Calling it again replaces the log (and announces the
        cached blocks again).
        """
        if self.num_groups == 1:
            log = KVEventLog(include_token_ids=include_token_ids)
        else:
            log = GroupZeroEventLog(self._digest_len, include_token_ids=include_token_ids)
        entries = [(b.block_hash, b.parent_hash, b.token_ids) for b in self.cached_blocks()
                   if len(b.block_hash) == self._digest_len]
        for event in stored_in_chain_order(entries, self.block_size, DEVICE_TIER,
                                           include_token_ids=include_token_ids):
            log.append(event)
        self._pool.events = log
        for attach in self._event_sources:
            attach(log)
        return log

    def pin_prefix(self, token_ids: Sequence[int], ttl_s: float, *, cache_salt: str | None = None,
                   extra_keys: tuple = ()) -> int:
        """Keeps the full blocks of ``token_ids`` (cached now or later, in every group) for ``ttl_s`` seconds:
        they are evicted only after every unpinned block. ``ttl_s <= 0`` unpins. Returns the blocks cached now
        (all groups)."""
        hashes = chain_block_hashes(None, token_ids, self.block_size,
                                    request_extra_keys(cache_salt, extra_keys), self.hash_algo)
        if self.num_groups > 1:
            hashes = [manager.key(h) for manager in self._coordinator.managers for h in hashes]
        return self._pool.pin(hashes, ttl_s)

    # ---------------------------------------------------------- in-flight blocks

    def _sync_in_flight(self, seq: SequenceState) -> None:
        """Registers the seq's allocated, hash-known, uncommitted blocks as in flight."""
        start = seq.num_hashed_blocks
        end = max(start, min(len(seq.tables[0]), len(seq.block_hashes)))
        old_start, old_end = seq.pending
        if start == end and old_start == old_end:
            seq.pending = (start, end)  # no block in flight before or after (most decode steps)
        elif (start, end) != seq.pending:
            self._set_in_flight(seq, (start, end))

    # --------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Checks every bookkeeping rule, per group, in O(pool + tables); raises AssertionError."""
        check_manager(self)


def _chain_salts(entries: Sequence[tuple[bytes, bytes | None, tuple[int, ...], tuple]],
                 cached: dict[bytes, KVBlock]) -> dict[bytes, str | None]:
    """Each restored entry's chain salt (``cache_restored_blocks``): block 0's own, else its parent's, the
    parent found among ``entries`` (group 0 keys are the plain hashes parents name) or in ``cached``."""
    by_key = {key: (parent, keys) for key, parent, _, keys in entries}
    salts: dict[bytes, str | None] = {}

    def salt_of_plain(block_hash: bytes) -> str | None:
        chain = []
        while block_hash not in salts:
            if block_hash not in by_key:  # outside the snapshot: the cached block's, if any
                block = cached.get(block_hash)
                salts[block_hash] = None if block is None else block.cache_salt
                break
            parent, keys = by_key[block_hash]
            if parent is None:
                salts[block_hash] = salt_of(keys)
                break
            chain.append(block_hash)
            block_hash = parent
        for link in chain:
            salts[link] = salts[block_hash]
        return salts[block_hash]

    out = {}
    for key, parent, _, keys in entries:
        out[key] = salt_of(keys) if parent is None else salt_of_plain(parent)
    return out


def _shared_write_error(seq_id: Hashable, block_id: int) -> ValueError:
    """The error of a commit that wrote into a block still shared with another sequence."""
    return ValueError(f"sequence {seq_id!r} wrote into shared block {block_id}; "
                      "call allocate_slots before the step so it is copied on write")
