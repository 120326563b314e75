"""The host tier's part of a snapshot: blocks keyed by hash alone, K/V in the snapshot's layout.

A host block travels as `[2, num_layers, num_kv_heads, block_size, head_dim]`
(see `jaxpaged.offload.transfer`); the snapshot stores every block as rows of
per-layer `[num_kv_heads, n, block_size, head_dim]` arrays, so host blocks are
appended after the device blocks and split back out on restore. Host blocks go
straight back into the host tier (LRU order kept, coldest first): a prefix
match continues into it, so no chain needs rebuilding.
"""

from __future__ import annotations

import numpy as np

from jaxpaged.offload.host_tier import HostBlock


def host_tier_blocks(engine) -> list[tuple[bytes, np.ndarray]]:
    """The host tier's landed blocks, coldest first; empty without a host tier."""
    tiers = getattr(engine, "tiers", None)
    if tiers is None:
        return []
    tiers.finish()  # land any offload still in flight
    return [(h, b.data) for h, b in tiers.host.items() if b.data is not None]


def append_host_blocks(kv: dict[str, list[np.ndarray]] | None,
                       blocks: list[np.ndarray]) -> dict[str, list[np.ndarray]]:
    """`kv` with the host blocks appended as extra rows of every layer."""
    stacked = np.stack(blocks)  # [n, 2, L, Hkv, B, D]
    host_k = [np.moveaxis(stacked[:, 0, layer], 0, 1) for layer in range(stacked.shape[2])]
    host_v = [np.moveaxis(stacked[:, 1, layer], 0, 1) for layer in range(stacked.shape[2])]
    if kv is None:
        return {"k": host_k, "v": host_v}
    return {"k": [np.concatenate([a, b], axis=1) for a, b in zip(kv["k"], host_k)],
            "v": [np.concatenate([a, b], axis=1) for a, b in zip(kv["v"], host_v)]}


def restore_host_blocks(engine, hashes: list[bytes], kv: dict[str, list[np.ndarray]],
                        rows: list[int]) -> int:
    """Put the snapshot's host blocks back into the engine's host tier; returns how many it kept.

    Coldest first, so when the tier is smaller than the snapshot the hottest survive.
    """
    tiers = engine.tiers
    k = np.stack([np.asarray(layer) for layer in kv["k"]])  # [L, Hkv, n, B, D]
    v = np.stack([np.asarray(layer) for layer in kv["v"]])
    for block_hash, row in zip(hashes, rows):
        tiers.host.put(block_hash, HostBlock(np.stack([k[:, :, row], v[:, :, row]])))
    return min(len(hashes), tiers.host.capacity_blocks - tiers.host.num_pinned)
