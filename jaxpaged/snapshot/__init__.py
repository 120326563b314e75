"""Persistent prefix cache: snapshot the cached KV blocks to disk and restore them into a new engine.

`save_prefix_cache(engine, path)` writes every cached block (hash, parent hash,
token ids, extra keys, tier, K/V contents) plus the engine's identity (model
config, weights fingerprint, block size, KV dtype and scales, hash function).
`load_prefix_cache(engine, path)` refuses a snapshot whose identity differs
(ValueError naming the field), then re-admits its blocks through the cache
manager and writes their K/V into the pool, so the first repeated prompt after
a restart hits the cache. `Engine.save_prefix_cache` / `EngineConfig.prefix_cache_snapshot`
are the usual entry points.
"""

from __future__ import annotations

from pathlib import Path

from jaxpaged.snapshot.device import blocks_to_layers, layers_to_block
from jaxpaged.snapshot.host import append_host_blocks, host_tier_blocks, restore_host_blocks
from jaxpaged.snapshot.identity import check_identity, engine_identity, params_fingerprint
from jaxpaged.snapshot.restore import RestoreStats, restore_into
from jaxpaged.snapshot.store import BlockRecord, is_snapshot_dir, read_kv, read_meta, write_snapshot

__all__ = ["RestoreStats", "is_snapshot_dir", "load_prefix_cache", "params_fingerprint",
           "save_prefix_cache"]


def save_prefix_cache(engine, path: str | Path) -> int:
    """Snapshot `engine`'s prefix cache to directory `path`; returns the block count.

    Device-pool blocks come first (tier "device", with the tokens that rebuild
    their chains), then the host tier's blocks if the engine has one (tier
    "host": hash and K/V only, since that tier is keyed by hash alone).
    An earlier snapshot at `path` is replaced; any other existing path is refused
    (ValueError), as is an engine without prefix caching.
    """
    _require_prefix_caching(engine, "save")
    blocks = engine.kv.cached_blocks()
    records = [BlockRecord(b.block_hash, b.parent_hash, b.token_ids, b.extra_keys, tier="device")
               for b in blocks]
    kv = blocks_to_layers(engine.runner.read_blocks([b.block_id for b in blocks])) if blocks else None
    host = host_tier_blocks(engine)
    records += [BlockRecord(block_hash, None, (), tier="host") for block_hash, _ in host]
    if host:
        kv = append_host_blocks(kv, [data for _, data in host])
    write_snapshot(path, engine_identity(engine), records, kv)
    return len(records)


def load_prefix_cache(engine, path: str | Path) -> RestoreStats:
    """Restore the snapshot at `path` into `engine`'s prefix cache and KV pool.

    Blocks go only into free, uncached pool blocks (hottest chains first when
    they do not all fit); nothing the engine holds is evicted.

    Raises:
      ValueError: `path` is not a snapshot, prefix caching is off, or the
        snapshot was made for a different model, weights, block size, KV dtype
        or hash function (the message names the field and both values).
    """
    _require_prefix_caching(engine, "restore")
    identity, records = read_meta(path)
    check_identity(identity, engine_identity(engine), str(path))
    if not records:
        return RestoreStats(0, 0, 0)
    kv = read_kv(path, len(records), engine.runner.kv_block_shape, engine.runner.kv_dtype)  # before the manager
    device = [r for r in records if r.tier == "device"]  # saved first: rows line up with `kv`
    writes, stats = restore_into(engine.kv, device)
    if writes:
        block_ids, rows = zip(*writes)
        engine.runner.write_blocks(list(block_ids), [layers_to_block(kv, row) for row in rows])
    host_rows = list(range(len(device), len(records)))
    if not host_rows:
        return stats
    if engine.tiers is None:  # no host tier here: its blocks cannot be used
        return RestoreStats(stats.num_restored, stats.num_skipped + len(host_rows), stats.num_dropped)
    kept = restore_host_blocks(engine, [records[i].block_hash for i in host_rows], kv, host_rows)
    return RestoreStats(stats.num_restored + kept, stats.num_skipped,
                        stats.num_dropped + len(host_rows) - kept)


def _require_prefix_caching(engine, action: str) -> None:
    if not engine.kv.enable_prefix_caching:
        raise ValueError(f"cannot {action} a prefix-cache snapshot: prefix caching is disabled")
