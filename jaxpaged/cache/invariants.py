"""Full consistency check of a KVCacheManager, recomputed from scratch (O(pool + tables)).

Used by tests after every step; too slow for the serving hot path.
"""

from __future__ import annotations

from collections import Counter

from jaxpaged.cache.hashing import hash_block_tokens
from jaxpaged.mathutils import cdiv


def check_manager(mgr) -> None:
    """Raises AssertionError naming the first broken rule of `mgr`, a KVCacheManager read through its internals."""
    pool = mgr._pool
    holders = Counter(block_id for seq in mgr._seqs.values() for block_id in seq.table)
    _check_ref_counts(pool, holders)
    _check_free_queue(pool)
    _check_prefix_cache(pool, mgr.hash_algo)
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


def _check_prefix_cache(pool, hash_algo: str) -> None:
    for block_hash, block in pool.cached.items():
        assert block.block_hash == block_hash, (
            f"hash entry {block_hash.hex()[:12]} points at block {block.block_id} "
            f"which records hash {block.block_hash!r}"
        )
        recomputed = hash_block_tokens(
            block.parent_hash, block.token_ids, block.extra_keys, hash_algo=hash_algo
        )
        assert recomputed == block_hash, (
            f"block {block.block_id}: recorded tokens hash to {recomputed.hex()[:12]}, "
            f"entry says {block_hash.hex()[:12]}"
        )
    hashed = sum(1 for block in pool.blocks if block.block_hash is not None)
    assert hashed == len(pool.cached), f"{hashed} blocks carry a hash but the map has {len(pool.cached)}"


def _check_sequence(mgr, seq_id, seq) -> None:
    bs = mgr.block_size
    table = seq.table
    assert len(set(table)) == len(table), f"sequence {seq_id!r}: a block appears twice in {table}"
    assert seq.num_computed <= len(table) * bs, (
        f"sequence {seq_id!r}: {seq.num_computed} computed tokens with {len(table)} blocks"
    )
    blocks = mgr._pool.blocks
    # Blocks with no computed token yet must be private: someone is about to write them.
    for index in range(cdiv(seq.num_computed, bs), len(table)):
        assert blocks[table[index]].ref_count == 1, (
            f"sequence {seq_id!r}: unwritten block {table[index]} is shared"
        )
    if not mgr.enable_prefix_caching:
        return
    assert seq.num_hashed_blocks == seq.num_computed // bs, (
        f"sequence {seq_id!r}: {seq.num_hashed_blocks} blocks offered to the cache, "
        f"{seq.num_computed // bs} full computed blocks"
    )
    for index in range(seq.num_hashed_blocks):
        block = blocks[table[index]]
        assert block.block_hash in (None, seq.block_hashes[index]), (
            f"sequence {seq_id!r}: block {block.block_id} at index {index} is cached under another hash"
        )


def _check_in_flight(mgr) -> None:
    expected: Counter = Counter()
    for seq in mgr._seqs.values():
        start, end = seq.pending
        assert start == seq.num_hashed_blocks, "in-flight range does not start at the first unhashed block"
        assert end == max(start, min(len(seq.table), len(seq.block_hashes))), "in-flight range is stale"
        expected.update(seq.block_hashes[start:end])
    assert dict(expected) == mgr._in_flight.counts, "in-flight hash counts disagree with the sequences"
