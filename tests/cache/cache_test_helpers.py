"""Shared helpers for the cache tests: admission shortcuts and state snapshots."""

from jaxpaged.cache import KVCacheManager


def prefill(mgr: KVCacheManager, seq_id, tokens, *, cache_salt=None) -> int:
    """Admits ``tokens`` whole, pretends the device ran, commits; returns cached tokens."""
    match = mgr.match_prefix(tokens, cache_salt=cache_salt)
    assert mgr.allocate_new(seq_id, tokens, len(tokens) - match.num_cached_tokens, match, cache_salt=cache_salt)
    mgr.commit(seq_id, tokens, len(tokens))
    return match.num_cached_tokens


def snapshot(mgr: KVCacheManager) -> tuple:
    """Everything observable about the manager's state, for "nothing changed" checks."""
    pool = mgr._pool
    return (
        mgr.stats,
        {sid: (mgr.block_table(sid), [list(t) for t in s.tables], s.skipped, s.num_computed, s.num_hashed_blocks, s.pending)
         for sid, s in mgr._seqs.items()},
        [b.block_id for b in pool.free_queue],
        [(b.ref_count, b.block_hash) for b in pool.blocks],
        dict(pool.cached),
        dict(mgr._in_flight.counts),
    )
