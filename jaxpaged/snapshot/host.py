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
from jaxpaged.offload.tiers import KVTiers
from jaxpaged.snapshot.device import blocks_to_layers, layers_to_block


def host_tier_blocks(tiers: KVTiers | None) -> list[tuple[bytes, np.ndarray]]:
    """The host tier's landed blocks, coldest first; empty without a host tier."""
    if tiers is None:
        return []
    tiers.finish()  # land any offload still in flight
    return [(h, b.data) for h, b in tiers.host.items() if b.data is not None]


def append_host_blocks(kv: dict[str, list[np.ndarray]] | None,
                       blocks: list[np.ndarray]) -> dict[str, list[np.ndarray]]:
    """`kv` with the host blocks appended as extra rows of every layer."""
    host = blocks_to_layers(blocks)
    if kv is None:
        return host
    return {name: [np.concatenate([a, b], axis=1) for a, b in zip(kv[name], host[name])]
            for name in ("k", "v")}


def restore_host_blocks(tiers: KVTiers, hashes: list[bytes], kv: dict[str, list[np.ndarray]],
                        rows: list[int]) -> int:
    """Put the snapshot's host blocks back into the host tier of `tiers`; returns how many it kept.

    Coldest first, so when the tier is smaller than the snapshot the hottest survive.
    """
    host = tiers.host
    for block_hash, row in zip(hashes, rows):
        host.put(block_hash, HostBlock(layers_to_block(kv, row)))
    return min(len(hashes), host.capacity_blocks - host.num_pinned)
