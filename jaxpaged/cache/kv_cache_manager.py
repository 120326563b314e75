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

Growth starts after the tokens the caller has already *scheduled*, not only the
committed ones, so the next step can be allocated while the current one still
runs (asynchronous scheduling): ``allocate_slots`` twice, then ``commit`` twice.
That count (committed plus in flight) has one owner, the caller (the
scheduler's ``Sequence.num_computed_tokens``, as vLLM v1's
``Request.num_computed_tokens``); the manager keeps only what is committed.

Contract: the token ids passed to ``commit`` start with the ones given to
``allocate_new`` (prompt hashes computed at admission are reused, not
re-derived), and every write goes through ``allocate_slots`` first, which is
where copy-on-write happens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence

from jaxpaged.cache.block_pool import BlockPool, KVBlock
from jaxpaged.cache.eviction import EvictionPolicy
from jaxpaged.cache.events import (
    DEVICE_TIER,
    BlockStored,
    KVEvent,
    KVEventLog,
    stored_in_chain_order,
)
from jaxpaged.cache.hashing import (
    chain_block_hashes,
    digest_fn,
    next_block_hasher,
    request_extra_keys,
)
from jaxpaged.cache.in_flight import InFlightHashes
from jaxpaged.cache.invariants import check_manager
from jaxpaged.cache.manager_queries import ManagerQueries, growth_error
from jaxpaged.cache.records import (
    NO_CHANGE,
    BlockTableUpdate,
    PrefixMatch,
    SequenceState,
)
from jaxpaged.mathutils import cdiv


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class KVCacheManager(ManagerQueries):
    """Block tables, ref counts, copy-on-write and automatic prefix caching.

    Pure Python: it never touches device arrays. It tells the engine which blocks
    a sequence owns (``block_table``) and which blocks to copy before a step.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        hash_algo: str = "sha256",
        eviction_policy: str | EvictionPolicy = "lru",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check_positive_int("num_blocks", num_blocks)
        _check_positive_int("block_size", block_size)
        digest_fn(hash_algo)  # raises ValueError for an unknown algorithm
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_algo = hash_algo
        self._hash_next_block = next_block_hasher(block_size, hash_algo)
        self._pool = BlockPool(num_blocks, eviction_policy=eviction_policy, clock=clock)
        self._seqs: dict[Hashable, SequenceState] = {}
        self._in_flight = InFlightHashes()
        self._queries_tokens = 0
        self._hits_tokens = 0
        self._cow_copies = 0
        self._event_sources: list[Callable[[KVEventLog | None], None]] = []

    # ----------------------------------------------------------------- queries

    @property
    def eviction_policy(self) -> str:
        """The name of the policy choosing among cached blocks at ref count 0."""
        return self._pool.policy.name

    def can_fit(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens could ever fit the pool."""
        return cdiv(num_tokens, self.block_size) <= self.num_blocks

    def block_table(self, seq_id: Hashable) -> list[int]:
        """A copy of the sequence's physical block ids, in token order."""
        return list(self._seq(seq_id).table)

    def num_blocks_held(self, seq_id: Hashable) -> int:
        """Blocks in the sequence's table (no copy: cheap enough for every step)."""
        return len(self._seq(seq_id).table)

    def _seq(self, seq_id: Hashable) -> SequenceState:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise ValueError(
                f"sequence {seq_id!r} is not held by the cache manager (never allocated or already freed)"
            )
        return seq

    def _check_fits(self, num_tokens: int, what: str) -> None:
        if not self.can_fit(num_tokens):
            raise ValueError(
                f"{what} of {num_tokens} tokens needs {cdiv(num_tokens, self.block_size)} blocks "
                f"of {self.block_size} tokens; the pool has only {self.num_blocks}"
            )

    # --------------------------------------------------------------- admission

    def match_prefix(
        self, token_ids: Sequence[int], *, cache_salt: str | None = None, extra_keys: tuple = ()
    ) -> PrefixMatch:
        """Finds the longest run of cached full blocks that prefixes ``token_ids``.

        No side effects. The run is capped so at least one token is left to compute.
        """
        request_keys = request_extra_keys(cache_salt, extra_keys)
        num_tokens = len(token_ids)
        if not self.enable_prefix_caching:
            return PrefixMatch([], 0, [], num_tokens=num_tokens, request_keys=request_keys)
        hashes = chain_block_hashes(None, token_ids, self.block_size, request_keys, self.hash_algo)
        max_blocks = max(num_tokens - 1, 0) // self.block_size
        lookup = self._pool.cached.get
        matched: list[KVBlock] = []
        for block_hash in hashes[:max_blocks]:
            block = lookup(block_hash)
            if block is None:
                break
            matched.append(block)
        num_pending = 0
        for index in range(len(matched), max_blocks):
            if hashes[index] not in self._in_flight:
                break
            num_pending += 1
        return PrefixMatch(
            blocks=[block.block_id for block in matched],
            num_cached_tokens=len(matched) * self.block_size,
            block_hashes=hashes,
            num_pending_tokens=num_pending * self.block_size,
            num_tokens=num_tokens,
            request_keys=request_keys,
            cache_epoch=self._pool.cache_epoch,
            matched=matched,
        )

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

        Takes the matched blocks (a cached free block is revived from the free
        queue) and enough fresh blocks for ``match.num_cached_tokens +
        num_new_tokens`` tokens. Returns False, changing nothing, when the pool has
        too few free blocks now. ``match=None`` skips the prefix cache lookup;
        ``count_query=False`` leaves the hit-rate counters alone (a sequence
        that must not use hits, e.g. one that needs its prompt's logits).

        Raises:
          ValueError: the sequence exists already, could never fit the pool,
            ``num_new_tokens`` is out of range, or ``match`` is for other tokens or
            stale (one of its blocks was evicted since ``match_prefix``).
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} is already allocated")
        num_tokens = len(token_ids)
        if num_tokens == 0:
            raise ValueError(f"sequence {seq_id!r} has no tokens")
        self._check_fits(num_tokens, f"sequence {seq_id!r}")
        request_keys = request_extra_keys(cache_salt, extra_keys)
        if match is None:
            match = self._no_match(token_ids, request_keys)
        else:
            self._check_match(match, num_tokens, request_keys)
        num_cached = match.num_cached_tokens
        if not 0 <= num_new_tokens <= num_tokens - num_cached:
            raise ValueError(
                f"num_new_tokens must be in [0, {num_tokens - num_cached}] "
                f"({num_tokens} tokens, {num_cached} cached), got {num_new_tokens}"
            )
        matched = match.matched
        num_fresh = cdiv(num_cached + num_new_tokens, self.block_size) - len(matched)
        # Reviving a cached free block takes it out of the free count too. Most of
        # the time the worst case (every match revived) fits and counting is skipped.
        if num_fresh > self._pool.num_free - len(matched):
            num_revived = sum(1 for block in matched if block.ref_count == 0)
            if num_fresh > self._pool.num_free - num_revived:
                return False
        self._pool.take(matched)  # first, so allocating can't evict them
        fresh = self._pool.allocate(num_fresh)
        seq = SequenceState(
            table=match.blocks + [block.block_id for block in fresh],
            num_computed=num_cached,
            num_cached_tokens=num_cached,
            block_hashes=list(match.block_hashes),
            num_hashed_blocks=len(matched),
            request_keys=request_keys,
            pending=(len(matched), len(matched)),
        )
        self._seqs[seq_id] = seq
        self._sync_in_flight(seq)
        if self.enable_prefix_caching and count_query:
            self._queries_tokens += num_tokens
            self._hits_tokens += num_cached
        return True

    def _no_match(self, token_ids: Sequence[int], request_keys: tuple) -> PrefixMatch:
        hashes = []
        if self.enable_prefix_caching:
            hashes = chain_block_hashes(None, token_ids, self.block_size, request_keys, self.hash_algo)
        return PrefixMatch([], 0, hashes, num_tokens=len(token_ids), request_keys=request_keys)

    def _check_match(self, match: PrefixMatch, num_tokens: int, request_keys: tuple) -> None:
        if match.num_tokens != num_tokens or match.request_keys != request_keys:
            raise ValueError(
                f"PrefixMatch is for {match.num_tokens} tokens with keys {match.request_keys!r}, "
                f"not these {num_tokens} tokens with keys {request_keys!r}"
            )
        if match.cache_epoch == self._pool.cache_epoch:
            return  # no hash entry has disappeared since the match: all still valid
        for block, block_hash in zip(match.matched, match.block_hashes):
            if block.block_hash != block_hash:
                raise ValueError(
                    f"stale PrefixMatch: block {block.block_id} was evicted since match_prefix; "
                    "call match_prefix again right before allocate_new"
                )

    # ------------------------------------------------------------------- growth

    def allocate_slots(self, seq_id: Hashable, num_new_tokens: int, *,
                       num_computed_tokens: int) -> BlockTableUpdate | None:
        """Makes room for the sequence to write ``num_new_tokens`` more tokens after its first
        ``num_computed_tokens`` (computed or being computed by steps in flight: the caller's count).

        Allocates blocks lazily. If the first block to be written is shared and
        already holds tokens, it is replaced by a private copy. Returns what
        changed in the block table (``NO_CHANGE`` when the last block has room),
        including the ``(src, dst)`` block copies the device must make first; or
        None, changing nothing, when there are too few free blocks.

        Raises:
          ValueError: unknown sequence, negative count, a start before the
            committed tokens or past the allocated slots, or a length that
            could never fit the pool.
        """
        seq = self._seqs.get(seq_id) or self._seq(seq_id)  # once per sequence per step: no extra call
        start, bs, table = num_computed_tokens, self.block_size, seq.table
        if num_new_tokens < 0 or not seq.num_computed <= start <= len(table) * bs:
            raise growth_error(seq_id, num_new_tokens, start, seq.num_computed, len(table) * bs)
        end = start + num_new_tokens
        num_fresh = cdiv(end, bs) - len(table) if end > len(table) * bs else 0
        if num_fresh > 0:
            self._check_fits(start + num_new_tokens, f"sequence {seq_id!r} grown")
        blocks = self._pool.blocks
        cow_index = -1
        if num_new_tokens > 0 and start % bs:
            # Only a partly written block can be shared and written: fork shares
            # blocks that hold computed tokens, and full blocks are never written.
            index = start // bs
            if blocks[table[index]].ref_count > 1:
                cow_index = index
        if num_fresh <= 0 and cow_index < 0:
            return NO_CHANGE  # the common decode step: room left in the last block
        num_fresh = max(num_fresh, 0)
        if num_fresh + (cow_index >= 0) > self._pool.num_free:
            return None
        first_changed = len(table)
        copies = ()
        if cow_index >= 0:
            shared = blocks[table[cow_index]]
            (private,) = self._pool.allocate(1)
            self._pool.release([shared])
            table[cow_index] = private.block_id
            copies = ((shared.block_id, private.block_id),)
            self._cow_copies += 1
            first_changed = cow_index
        if num_fresh:
            table_len = len(table)
            table.extend([block.block_id for block in self._pool.allocate(num_fresh)])
            if len(seq.block_hashes) > table_len:  # prompt blocks with known hashes just got slots
                self._sync_in_flight(seq)
        return BlockTableUpdate(first_changed, table[first_changed:], copies)

    def commit(self, seq_id: Hashable, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Records that the first ``num_computed_tokens`` of ``token_ids`` now have K/V.

        Every newly full block is hashed (chained) and published in the prefix
        cache, generated tokens included. A block whose hash is already cached
        elsewhere stays private to this sequence.

        Raises:
          ValueError: unknown sequence; a count that goes backwards, exceeds the
            tokens given or the slots allocated; or a write into a block still
            shared with another sequence (``allocate_slots`` was skipped).
        """
        seq = self._seqs.get(seq_id) or self._seq(seq_id)  # once per sequence per step: no extra call
        old, new = seq.num_computed, num_computed_tokens
        bs, table = self.block_size, seq.table
        if not old <= new <= len(token_ids) or new > len(table) * bs:
            limit = min(len(token_ids), len(table) * bs)
            raise ValueError(
                f"num_computed_tokens for {seq_id!r} must be in [{old}, {limit}] "
                f"({len(token_ids)} tokens, {len(table)} blocks allocated), got {new}"
            )
        if new > old:
            blocks = self._pool.blocks
            for index in range(old // bs, (new - 1) // bs + 1):
                if blocks[table[index]].ref_count > 1:
                    raise ValueError(
                        f"sequence {seq_id!r} wrote into shared block {seq.table[index]}; "
                        "call allocate_slots before the step so it is copied on write"
                    )
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
                parent, token_ids[start * bs : num_full * bs], bs, first_keys, self.hash_algo
            )
        blocks, table, cache_block = self._pool.blocks, seq.table, self._pool.cache_block
        if self._pool.events is not None:
            self._publish_with_events(seq, token_ids, num_full)
        else:
            for index in range(seq.num_hashed_blocks, num_full):
                cache_block(
                    blocks[table[index]],
                    hashes[index],
                    hashes[index - 1] if index else None,
                    tuple(token_ids[index * bs : (index + 1) * bs]),
                    seq.request_keys if index == 0 else (),
                )
        seq.num_hashed_blocks = num_full
        self._sync_in_flight(seq)

    def _publish_with_events(self, seq: SequenceState, token_ids: Sequence[int], num_full: int) -> None:
        """``_publish_full_blocks``' caching loop, recording one ``BlockStored`` per run of stored blocks.

        A block whose hash was cached already stays private and breaks the run.
        """
        bs, hashes, log = self.block_size, seq.block_hashes, self._pool.events
        blocks, table, cache_block = self._pool.blocks, seq.table, self._pool.cache_block
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
            stored = cache_block(blocks[table[index]], hashes[index], hashes[index - 1] if index else None,
                                 block_tokens, seq.request_keys if index == 0 else ())
            if stored:
                run.append(index)
            else:
                flush()
        flush()

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Starts ``child_id`` sharing every parent block that holds computed tokens.

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
        shared_ids = parent.table[: cdiv(parent.num_computed, self.block_size)]
        self._pool.take([self._pool.blocks[i] for i in shared_ids])
        done = parent.num_hashed_blocks
        self._seqs[child_id] = SequenceState(
            table=list(shared_ids),
            num_computed=parent.num_computed,
            num_cached_tokens=parent.num_cached_tokens,
            # Hashes past the computed blocks came from the parent's tokens; the
            # child's may differ there, so it re-derives them from its own.
            block_hashes=parent.block_hashes[:done],
            num_hashed_blocks=done,
            request_keys=parent.request_keys,
            pending=(done, done),
        )

    # ------------------------------------------------------------------ release

    def free(self, seq_id: Hashable) -> None:
        """Releases all the sequence's blocks, deepest first (so deepest is evicted first).

        Raises:
          ValueError: the sequence is unknown or was already freed.
        """
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        self._set_in_flight(seq, (seq.pending[1], seq.pending[1]))
        blocks = self._pool.blocks
        self._pool.release([blocks[i] for i in reversed(seq.table)])

    # ------------------------------------------------------------------- events

    def enable_events(self, *, include_token_ids: bool = False) -> KVEventLog:
        """Starts recording prefix-cache events (``jaxpaged.cache.events``) of every tier; returns the log.

        The log starts with a ``BlockStored`` for every block already cached
        (device first, then each lower tier added with :meth:`add_event_source`),
        parents before children, so replaying it from here mirrors each tier
        even when blocks were cached before (a snapshot restore, a router that
        attaches late). Calling it again replaces the log (and announces the
        cached blocks again).
        """
        log = KVEventLog(include_token_ids=include_token_ids)
        entries = [(b.block_hash, b.parent_hash, b.token_ids) for b in self.cached_blocks()]
        for event in stored_in_chain_order(entries, self.block_size, DEVICE_TIER,
                                           include_token_ids=include_token_ids):
            log.append(event)
        self._pool.events = log
        for attach in self._event_sources:
            attach(log)
        return log

    def pin_prefix(self, token_ids: Sequence[int], ttl_s: float, *, cache_salt: str | None = None,
                   extra_keys: tuple = ()) -> int:
        """Keeps the full blocks of ``token_ids`` (cached now or later) for ``ttl_s`` seconds: they are
        evicted only after every unpinned block. ``ttl_s <= 0`` unpins. Returns the blocks cached now."""
        hashes = chain_block_hashes(None, token_ids, self.block_size,
                                    request_extra_keys(cache_salt, extra_keys), self.hash_algo)
        return self._pool.pin(hashes, ttl_s)

    # ---------------------------------------------------------- in-flight blocks

    def _sync_in_flight(self, seq: SequenceState) -> None:
        """Registers the seq's allocated, hash-known, uncommitted blocks as in flight."""
        start = seq.num_hashed_blocks
        end = max(start, min(len(seq.table), len(seq.block_hashes)))
        old_start, old_end = seq.pending
        if start == end and old_start == old_end:
            seq.pending = (start, end)  # no block in flight before or after (most decode steps)
        elif (start, end) != seq.pending:
            self._set_in_flight(seq, (start, end))

    # --------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Checks every bookkeeping rule in O(pool + tables); raises AssertionError."""
        check_manager(self)
