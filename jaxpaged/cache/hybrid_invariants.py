"""Full consistency check of a HybridKVCacheManager, per KV cache group (tests only: O(pool + tables))."""

from __future__ import annotations

from collections import Counter

from jaxpaged.cache.hashing import hash_block_tokens
from jaxpaged.cache.kv_groups import NULL_BLOCK, group_key
from jaxpaged.cache.invariants import _check_free_queue, _check_ref_counts
from jaxpaged.mathutils import cdiv


def check_hybrid_manager(mgr) -> None:
    """Raises AssertionError naming the first broken rule of `mgr`, read through its internals.

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
    for seq_id, seq in mgr._seqs.items():
        for g, table in enumerate(seq.tables):
            for b in table:
                if b != NULL_BLOCK:
                    assert group_of.setdefault(b, g) == g, f"block {b} is held by groups {group_of[b]} and {g}"
    _check_prefix_cache(mgr, group_of)
    for seq_id, seq in mgr._seqs.items():
        _check_sequence(mgr, seq_id, seq)
    expected: Counter = Counter()
    for seq in mgr._seqs.values():
        start, end = seq.pending
        assert start == seq.num_hashed_blocks, "in-flight range does not start at the first unhashed block"
        assert end == max(start, min(len(seq.tables[0]), len(seq.block_hashes))), "in-flight range is stale"
        expected.update(seq.block_hashes[start:end])
    assert dict(expected) == mgr._in_flight.counts, "in-flight hash counts disagree with the sequences"


def _check_prefix_cache(mgr, group_of: dict[int, int]) -> None:
    pool = mgr._pool
    for key, block in pool.cached.items():
        assert block.block_hash == key, f"entry {key.hex()[:12]} points at block {block.block_id} with another key"
        plain = hash_block_tokens(block.parent_hash, block.token_ids, block.extra_keys, hash_algo=mgr.hash_algo)
        groups = [g for g in range(mgr.num_groups) if group_key(plain, g) == key]
        assert groups, f"block {block.block_id}: its tokens do not hash to its key in any group"
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
        f"sequence {seq_id!r}: {seq.num_computed} computed, {length} blocks")
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
        for index in range(cdiv(seq.num_computed, bs), length):
            assert blocks[table[index]].ref_count == 1, f"sequence {seq_id!r}: unwritten block {table[index]} is shared"
        if mgr.enable_prefix_caching:
            for index in range(skipped, seq.num_hashed_blocks):
                block = blocks[table[index]]
                assert block.block_hash in (None, group_key(seq.block_hashes[index], g)), (
                    f"sequence {seq_id!r}: block {block.block_id} at index {index} is cached under another key")
    if mgr.enable_prefix_caching:
        assert seq.num_hashed_blocks == seq.num_computed // bs, (
            f"sequence {seq_id!r}: {seq.num_hashed_blocks} blocks offered, {seq.num_computed // bs} full")
