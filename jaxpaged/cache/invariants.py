"""Full consistency check of a KVCacheManager, per KV cache group, recomputed from scratch (O(pool + tables)).

Used by tests after every step; too slow for the serving hot path.
"""

from __future__ import annotations

from collections import Counter

from jaxpaged.cache.hashing import hash_block_tokens
from jaxpaged.cache.kv_groups import NULL_BLOCK, group_key
from jaxpaged.mathutils import cdiv


def check_manager(mgr) -> None:
    """Raises AssertionError naming the first broken rule of `mgr`, a KVCacheManager read through its internals.

    DESIGN's rules hold per group (ref counts count every group's tables; a
    block is in one group's tables at a time and cached under that group's
    key), plus the sliding-window rule: an entry is null exactly for the
    leading blocks no future query can see.
    """
    pool = mgr._pool
    holders = Counter(b for seq in mgr._seqs.values() for table in seq.tables for b in table if b != NULL_BLOCK)
    _check_ref_counts(pool, holders)
    _check_free_queue(pool)
    group_of: dict[int, int] = {}
    for seq in mgr._seqs.values():
        for g, table in enumerate(seq.tables):
            for b in table:
                if b != NULL_BLOCK:
                    assert group_of.setdefault(b, g) == g, f"block {b} is held by groups {group_of[b]} and {g}"
    _check_prefix_cache(mgr, group_of)
    for seq_id, seq in mgr._seqs.items():
        _check_sequence(mgr, seq_id, seq)
    _check_in_flight(mgr)


def _check_ref_counts(pool, holders: Counter) -> None:
    for block in pool.blocks:
        assert block.ref_count == holders.get(block.block_id, 0), (
            f"block {block.block_id}: ref_count {block.ref_count} but held by "
            f"{holders.get(block.block_id, 0)} block tables"
        )
    used = sum(1 for block in pool.blocks if block.ref_count > 0)
    assert used == pool.num_used, f"num_used counter {pool.num_used} != {used} blocks with ref > 0"


def _check_free_queue(pool) -> None:
    queued = list(pool.free_queue)
    ids = [block.block_id for block in queued]
    assert len(ids) == len(set(ids)) == len(pool.free_queue), f"free lists have duplicates: {ids}"
    free = {block.block_id for block in pool.blocks if block.ref_count == 0}
    assert set(ids) == free, (
        f"free lists {sorted(ids)} != blocks with ref 0 {sorted(free)} (free and used must partition the pool)"
    )
    pool.empty.check_links()
    pool.pinned.check_links()
    pool.policy.check()
    assert all(block.block_hash is None and block.free_in is pool.empty for block in pool.empty), (
        "a block in the empty list holds cached content"
    )
    for block in pool.policy:
        assert block.block_hash is not None and block.free_in is pool.policy.home, (
            f"block {block.block_id} in the eviction policy is uncached or says it is elsewhere"
        )
    for block in pool.pinned:
        assert block.block_hash is not None and block.free_in is pool.pinned, (
            f"block {block.block_id} in the pinned list is uncached or says it is elsewhere"
        )
        assert block.block_hash in pool.pins.deadlines, f"block {block.block_id} is pinned without a pin"
    for block in pool.blocks:
        if block.ref_count > 0:
            assert block.free_in is None, f"block {block.block_id} is held and in a free list"


def _check_prefix_cache(mgr, group_of: dict[int, int]) -> None:
    pool = mgr._pool
    for key, block in pool.cached.items():
        assert block.block_hash == key, (
            f"hash entry {key.hex()[:12]} points at block {block.block_id} which records hash {block.block_hash!r}")
        plain = hash_block_tokens(block.parent_hash, block.token_ids, block.extra_keys, hash_algo=mgr.hash_algo)
        groups = [g for g in range(mgr.num_groups) if group_key(plain, g) == key]
        assert groups, (
            f"block {block.block_id}: recorded tokens hash to {plain.hex()[:12]}, "
            f"entry says {key.hex()[:12]} (in no group)")
        if block.block_id in group_of:
            assert group_of[block.block_id] == groups[0], (
                f"block {block.block_id} is cached for group {groups[0]} but held by group {group_of[block.block_id]}")
    hashed = sum(1 for block in pool.blocks if block.block_hash is not None)
    assert hashed == len(pool.cached), f"{hashed} blocks carry a hash but the map has {len(pool.cached)}"


def _check_sequence(mgr, seq_id, seq) -> None:
    bs, blocks = mgr.block_size, mgr._pool.blocks
    length = len(seq.tables[0])
    assert all(len(table) == length for table in seq.tables), f"sequence {seq_id!r}: groups' tables differ in length"
    assert seq.num_computed <= length * bs, (
        f"sequence {seq_id!r}: {seq.num_computed} computed tokens with {length} blocks")
    live = [b for table in seq.tables for b in table if b != NULL_BLOCK]
    assert len(set(live)) == len(live), f"sequence {seq_id!r}: a block appears twice in {seq.tables}"
    for g, (table, window) in enumerate(zip(seq.tables, mgr.windows)):
        skipped = seq.skipped[g]
        assert all(b == NULL_BLOCK for b in table[:skipped]), f"sequence {seq_id!r} group {g}: null run broken"
        assert all(b != NULL_BLOCK for b in table[skipped:]), f"sequence {seq_id!r} group {g}: a needed block is null"
        if window is None:
            assert skipped == 0, f"sequence {seq_id!r}: full-attention group {g} dropped blocks"
        else:
            # never drop a block the next query (at position num_computed) can see
            assert skipped * bs <= max(seq.num_computed - window + 1, 0), (
                f"sequence {seq_id!r} group {g}: {skipped} blocks dropped, window {window}, "
                f"{seq.num_computed} tokens computed")
        # Blocks with no computed token yet must be private: someone is about to write them.
        for index in range(cdiv(seq.num_computed, bs), length):
            assert blocks[table[index]].ref_count == 1, f"sequence {seq_id!r}: unwritten block {table[index]} is shared"
        if mgr.enable_prefix_caching:
            for index in range(skipped, seq.num_hashed_blocks):
                block = blocks[table[index]]
                assert block.block_hash in (None, group_key(seq.block_hashes[index], g)), (
                    f"sequence {seq_id!r}: block {block.block_id} at index {index} is cached under another key")
    if mgr.enable_prefix_caching:
        assert seq.num_hashed_blocks == seq.num_computed // bs, (
            f"sequence {seq_id!r}: {seq.num_hashed_blocks} blocks offered to the cache, "
            f"{seq.num_computed // bs} full computed blocks")


def _check_in_flight(mgr) -> None:
    expected: Counter = Counter()
    for seq in mgr._seqs.values():
        start, end = seq.pending
        assert start == seq.num_hashed_blocks, "in-flight range does not start at the first unhashed block"
        assert end == max(start, min(len(seq.tables[0]), len(seq.block_hashes))), "in-flight range is stale"
        expected.update(seq.block_hashes[start:end])
    assert dict(expected) == mgr._in_flight.counts, "in-flight hash counts disagree with the sequences"
