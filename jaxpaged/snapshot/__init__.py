"""Persistent prefix cache: snapshot the cached KV blocks to disk and restore them into a new engine.

`save_prefix_cache(parts, path)` writes every cached block (hash, parent hash,
token ids, extra keys, tier, K/V contents) plus the engine's identity (model
config, weights fingerprint, block size, KV dtype and scales, hash function).
`load_prefix_cache(parts, path)` refuses a snapshot whose identity differs
(ValueError naming the field, the KV cache group layout included), then
re-admits its blocks through the cache manager (per group with sliding-window
layers: ``jaxpaged.snapshot.groups``) and writes their K/V into the pool, so the first repeated prompt after
a restart hits the cache. `Engine.save_prefix_cache` / `Engine.load_prefix_cache` / `EngineConfig.prefix_cache_snapshot`
(`restore_prefix_cache_at_start`) are the entry points: the engine hands this package its `EngineParts` (the KV
manager, the runner that holds the pool, the tiers: the `SnapshotParts` this
package declares), which it reads and writes as the engine's own persistence.
"""

from __future__ import annotations

from pathlib import Path

from jaxpaged.snapshot.device import blocks_to_layers, layers_to_block
from jaxpaged.snapshot.groups import key_and_group, manager_key, restore_groups_into
from jaxpaged.snapshot.host import append_host_blocks, host_tier_blocks, restore_host_blocks
from jaxpaged.snapshot.identity import (adopt_snapshot_kv_scales, check_identity, engine_identity,
                                        identity_digest, params_fingerprint, tie_disk_tier_to_identity)
from jaxpaged.snapshot.parts import SnapshotParts
from jaxpaged.snapshot.restore import RestoreStats, restore_into
from jaxpaged.snapshot.store import BlockRecord, block_digest, is_snapshot_dir, read_kv, read_meta, write_snapshot

__all__ = ["RestoreStats", "engine_identity", "identity_digest", "is_snapshot_dir", "load_prefix_cache",
           "params_fingerprint", "restore_prefix_cache_at_start", "save_prefix_cache", "tie_disk_tier_to_identity"]


def save_prefix_cache(parts: SnapshotParts, path: str | Path) -> int:
    """Snapshot the prefix cache of the engine built from `parts` to directory `path`; returns the block count.

    Device-pool blocks come first (tier "device", with the tokens that rebuild
    their chains), then the host tier's blocks if the engine has one (tier
    "host": hash and K/V only, since that tier is keyed by hash alone). Every
    record carries the digest of its block's K/V bytes.
    An earlier snapshot at `path` is replaced; any other existing path is refused
    (ValueError), as is an engine without prefix caching.
    """
    _require_prefix_caching(parts, "save")
    blocks = parts.kv.cached_blocks()
    data = parts.runner.read_blocks([b.block_id for b in blocks]) if blocks else []
    records = [_record(parts, b.block_hash, parent_hash=b.parent_hash, token_ids=b.token_ids,
                       extra_keys=b.extra_keys, tier="device", digest=block_digest(d)) for b, d in zip(blocks, data)]
    kv = blocks_to_layers(data) if blocks else None
    host = host_tier_blocks(parts.tiers)
    records += [_record(parts, key, parent_hash=None, token_ids=(), tier="host", digest=block_digest(d))
                for key, d in host]
    if host:
        kv = append_host_blocks(kv, [d for _, d in host])
    write_snapshot(path, engine_identity(parts), records, kv)
    return len(records)


def load_prefix_cache(parts: SnapshotParts, path: str | Path, *, adopt_kv_scales: bool = False) -> RestoreStats:
    """Restore the snapshot at `path` into the prefix cache and KV pool of the engine built from `parts`.

    Blocks go only into free, uncached pool blocks (hottest chains first when
    they do not all fit); nothing the engine holds is evicted. A block whose
    K/V row is missing or whose bytes do not match its digest is skipped, with
    every block that descends from it. `adopt_kv_scales` (an fp8 engine whose
    scales are not calibrated yet) takes the snapshot's scales first.

    Raises:
      ValueError: `path` is not a snapshot or its files are corrupt (the
        message names the file), prefix caching is off, or the snapshot was
        made for a different model, weights, block size, KV dtype or hash
        function (the message names the field and both values).
    """
    _require_prefix_caching(parts, "restore")
    identity, num_rows, records = read_meta(path)
    runner = parts.runner
    if adopt_kv_scales:
        adopt_snapshot_kv_scales(runner, identity, str(path))
    check_identity(identity, engine_identity(parts), str(path))
    if not records:
        return RestoreStats(0, 0, 0)
    kv, rows = read_kv(path, num_rows, len(records[0].row_key), runner.kv_block_shape, runner.kv_dtype)
    intact = [(r, rows[r.row_key]) for r in records
              if r.row_key in rows and block_digest(layers_to_block(kv, rows[r.row_key])) == r.digest]
    num_corrupt = len(records) - len(intact)
    device = [(r, row) for r, row in intact if r.tier == "device"]
    restore = restore_into if parts.kv.unitary else restore_groups_into  # chains, or each group's own blocks
    writes, stats = restore(parts.kv, [r for r, _ in device])
    if writes:
        block_ids, indices = zip(*writes)
        runner.write_blocks(list(block_ids), [layers_to_block(kv, device[i][1]) for i in indices])
    stats = RestoreStats(stats.num_restored, stats.num_skipped + num_corrupt, stats.num_dropped)
    host = [(r, row) for r, row in intact if r.tier == "host"]
    if not host:
        return stats
    if parts.tiers is None:  # no host tier here: its blocks cannot be used
        return RestoreStats(stats.num_restored, stats.num_skipped + len(host), stats.num_dropped)
    kept = restore_host_blocks(parts.tiers, [manager_key(parts.kv, r) for r, _ in host], kv,
                               [row for _, row in host])
    return RestoreStats(stats.num_restored + kept, stats.num_skipped, stats.num_dropped + len(host) - kept)


def restore_prefix_cache_at_start(parts: SnapshotParts, *, adopt_kv_scales: bool = False) -> RestoreStats | None:
    """Restore `prefix_cache_snapshot` into a just-built engine; None when there is none (no path given, or a
    first start: nothing saved there yet). Otherwise as `load_prefix_cache`."""
    path = parts.config.prefix_cache_snapshot
    if not path or not Path(path).exists():
        return None
    return load_prefix_cache(parts, path, adopt_kv_scales=adopt_kv_scales)


def _record(parts: SnapshotParts, key: bytes, **fields) -> BlockRecord:
    """The record of the block the engine caches under ``key`` (hash and KV cache group split apart)."""
    block_hash, group = key_and_group(parts.kv, key)
    return BlockRecord(block_hash, group=group, **fields)


def _require_prefix_caching(parts: SnapshotParts, action: str) -> None:
    if not parts.kv.enable_prefix_caching:
        raise ValueError(f"cannot {action} a prefix-cache snapshot: prefix caching is disabled")
