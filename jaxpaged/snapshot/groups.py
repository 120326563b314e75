"""Snapshots of a cache with several KV cache groups (sliding-window models).

A block id holds one group's layers, and each group has its own prefix-cache
entries (a sliding group only the blocks it still held), so a record is one
group's block: its hash, its group, and the hash's inputs. On restore each
record is checked on its own (the hash recomputed from its parent hash, tokens
and extra keys, which is what chaining commits to) rather than as part of a
root-to-leaf chain: a sliding group's window blocks have no cached parents in
their group. Verified records go into empty pool blocks at ref count 0, hottest
first when they do not all fit, under the same group keys a computed block
would get, so a prefix hit after the restore needs exactly what it needed
before: every block in the full groups, the window's blocks in the sliding ones.
"""

from __future__ import annotations

from jaxpaged.cache.hashing import chain_block_hashes, digest_fn
from jaxpaged.cache.kv_groups import group_key, split_group_key
from jaxpaged.snapshot.restore import RestoreStats
from jaxpaged.snapshot.store import BlockRecord


def key_and_group(manager, key: bytes) -> tuple[bytes, int]:
    """A manager's prefix-cache key as (block hash, group) (group 0 keys by the plain hash)."""
    return split_group_key(key, len(digest_fn(manager.hash_algo)(b"")))


def manager_key(manager, record: BlockRecord) -> bytes:
    """The key ``manager`` caches ``record``'s block under."""
    return group_key(record.block_hash, record.group)


def _verified(manager, record: BlockRecord) -> bool:
    if len(record.token_ids) != manager.block_size or not 0 <= record.group < manager.num_groups:
        return False
    try:
        (block_hash,) = chain_block_hashes(record.parent_hash, record.token_ids, manager.block_size,
                                           record.extra_keys if record.parent_hash is None else (),
                                           manager.hash_algo)
    except (ValueError, TypeError):  # token ids or extra keys the hash cannot encode: a corrupt record
        return False
    return block_hash == record.block_hash


def restore_groups_into(manager, records: list[BlockRecord]) -> tuple[list[tuple[int, int]], RestoreStats]:
    """Cache the snapshot's device blocks in a ``KVCacheManager`` with sliding groups without evicting anything.

    Returns ``(block_id, record_index)`` pairs whose K/V the caller must write, and the stats.
    """
    good = [i for i, r in enumerate(records) if _verified(manager, r)]
    num_skipped = len(records) - len(good)
    live = manager.cached_blocks()
    known = {b.block_hash for b in live}
    new = [i for i in good if manager_key(manager, records[i]) not in known]
    budget = manager.num_free_blocks - sum(1 for b in live if b.ref_count == 0)  # the empty blocks
    chosen = new[max(len(new) - budget, 0):]  # records run coldest first: keep the hottest
    entries = [(manager_key(manager, records[i]), records[i].parent_hash, records[i].token_ids,
                records[i].extra_keys) for i in chosen]
    block_ids = manager.cache_restored_blocks(entries)
    writes = [(block_id, i) for block_id, i in zip(block_ids, chosen) if block_id is not None]
    cached = {b.block_hash for b in manager.cached_blocks()}
    restored = sum(1 for i in good if manager_key(manager, records[i]) in cached)
    return writes, RestoreStats(restored, num_skipped, len(good) - restored)
