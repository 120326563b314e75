"""Re-admitting snapshot blocks into a live `KVCacheManager` through its public API.

Each chain of cached blocks (root to leaf, rebuilt from parent hashes) is
admitted as a pseudo sequence: `match_prefix` + `allocate_new` with the chain's
tokens and block-0 extra keys, `commit` of all its tokens, then `free`. The
blocks end up cached and evictable exactly as if a request had computed them;
the caller then writes their K/V into the pool. A chain whose hashes, as the
manager recomputes them, differ from the stored ones is skipped.

The manager counts these pseudo admissions in its prefix query/hit token
counters, like any admission.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.cache import KVCacheManager
from jaxpaged.snapshot.store import BlockRecord

_SEQ_TAG = "jaxpaged.snapshot.restore"


@dataclasses.dataclass(frozen=True)
class RestoreStats:
    """Outcome of restoring a snapshot, in blocks."""

    num_restored: int  # snapshot blocks now in the prefix cache
    num_skipped: int  # in a chain that failed verification (hash mismatch, missing parent)
    num_dropped: int  # left out because the pool had no free room for them


def _chains(records: list[BlockRecord]) -> tuple[list[list[int]], set[int]]:
    """Root-to-leaf record indices of every leaf's chain (coldest leaf first), and orphaned records."""
    by_hash = {r.block_hash: i for i, r in enumerate(records)}
    parents = {r.parent_hash for r in records}
    chains, orphans = [], set()
    for leaf, record in enumerate(records):
        if record.block_hash in parents:
            continue
        chain, node = [leaf], record
        while node.parent_hash is not None and len(chain) <= len(records):
            index = by_hash.get(node.parent_hash)
            if index is None:
                break
            chain.append(index)
            node = records[index]
        if node.parent_hash is None:
            chains.append(chain[::-1])
        else:  # its root is not in the snapshot (or a cycle): the hashes cannot be re-derived
            orphans.update(chain)
    return chains, orphans


def _select(chains: list[list[int]], records: list[BlockRecord], cached: set[bytes],
            budget: int) -> list[list[int]]:
    """The chains to restore, hottest first while their new blocks fit `budget`; returned coldest first."""
    chosen, have = [], set(cached)
    for chain in reversed(chains):
        new = [records[i].block_hash for i in chain if records[i].block_hash not in have]
        if len(new) <= budget:
            budget -= len(new)
            have.update(new)
            chosen.append(chain)
    return chosen[::-1]


def _verified_prefix(manager: KVCacheManager, records: list[BlockRecord], chain: list[int]) -> int:
    """How many leading blocks of `chain` have the stored hash when the manager recomputes it."""
    bs = manager.block_size
    full = next((j for j, i in enumerate(chain) if len(records[i].token_ids) != bs), len(chain))
    tokens = [t for i in chain[:full] for t in records[i].token_ids]
    try:
        hashes = manager.match_prefix(tokens, extra_keys=records[chain[0]].extra_keys).block_hashes
    except ValueError:  # token ids or extra keys the hash cannot encode: a corrupt record
        return 0
    return next((j for j, (h, i) in enumerate(zip(hashes, chain)) if h != records[i].block_hash), full)


def restore_into(manager: KVCacheManager,
                 records: list[BlockRecord]) -> tuple[list[tuple[int, int]], RestoreStats]:
    """Cache the snapshot's blocks in `manager` without evicting anything it holds.

    Returns `(block_id, record_index)` pairs whose K/V the caller must write,
    and the stats. Only blocks fresh from the free list are used.
    """
    live = manager.cached_blocks()
    budget = manager.num_free_blocks - sum(1 for b in live if b.ref_count == 0)
    chains, orphans = _chains(records)
    writes: dict[bytes, tuple[int, int]] = {}
    skipped = set(orphans)
    for n, chain in enumerate(_select(chains, records, {b.block_hash for b in live}, budget)):
        good = _verified_prefix(manager, records, chain)
        skipped.update(chain[good:])
        chain = chain[:good]
        if not chain:
            continue
        tokens = [t for i in chain for t in records[i].token_ids]
        keys = records[chain[0]].extra_keys
        match = manager.match_prefix(tokens, extra_keys=keys)
        seq_id = (_SEQ_TAG, n)
        if not manager.allocate_new(seq_id, tokens, len(tokens) - match.num_cached_tokens, match,
                                    extra_keys=keys):
            continue
        table = manager.block_table(seq_id)
        for j in range(len(match.blocks), len(chain)):
            writes[records[chain[j]].block_hash] = (table[j], chain[j])
        manager.commit(seq_id, tokens, len(tokens))
        manager.free(seq_id)
    # keep only blocks that really hold their hash now (a duplicate of a cached one stays private)
    holder = {b.block_hash: b.block_id for b in manager.cached_blocks()}
    final = [pair for block_hash, pair in writes.items() if holder.get(block_hash) == pair[0]]
    restored = sum(1 for r in records if r.block_hash in holder)
    skipped -= {i for i, r in enumerate(records) if r.block_hash in holder}
    stats = RestoreStats(restored, len(skipped), len(records) - restored - len(skipped))
    return final, stats
