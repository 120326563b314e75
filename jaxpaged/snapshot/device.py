"""Moving whole blocks between the device pool and a snapshot's per-layer arrays.

The transfers themselves are the offload tier's (one padded gather or one
donated scatter per call, `jaxpaged.offload.transfer`), which move blocks as
`[2, num_layers, num_kv_heads, block_size, head_dim]`; a snapshot stores them as
rows of per-layer `[num_kv_heads, n, block_size, head_dim]` arrays. This module
converts between the two.
"""

from __future__ import annotations

import numpy as np

from jaxpaged.kv.pool import KVPool
from jaxpaged.offload.transfer import gather_blocks, scatter_blocks


def blocks_to_layers(blocks: list[np.ndarray]) -> dict[str, list[np.ndarray]]:
    """Per-block arrays `[2, L, Hkv, B, D]` -> {"k": [layer...], "v": [layer...]}, each `[Hkv, n, B, D]`."""
    stacked = np.stack(blocks)  # [n, 2, L, Hkv, B, D]
    layers = range(stacked.shape[2])
    return {"k": [np.moveaxis(stacked[:, 0, layer], 0, 1) for layer in layers],
            "v": [np.moveaxis(stacked[:, 1, layer], 0, 1) for layer in layers]}


def layers_to_block(kv: dict[str, list[np.ndarray]], row: int) -> np.ndarray:
    """Row `row` of per-layer arrays as one block `[2, L, Hkv, B, D]`."""
    k = np.stack([np.asarray(layer)[:, row] for layer in kv["k"]])
    v = np.stack([np.asarray(layer)[:, row] for layer in kv["v"]])
    return np.stack([k, v])


def read_blocks(pool: KVPool, block_ids: list[int]) -> dict[str, list[np.ndarray]]:
    """Host copies of blocks `block_ids`: {"k": [layer...], "v": [layer...]}, each [Hkv, n, B, D]."""
    return blocks_to_layers(gather_blocks(pool, block_ids))


def write_blocks(pool: KVPool, block_ids: list[int], kv: dict[str, list[np.ndarray]],
                 rows: list[int]) -> KVPool:
    """Return `pool` with block `block_ids[i]` set to row `rows[i]` of `kv` in every layer; pool donated."""
    return scatter_blocks(pool, block_ids, [layers_to_block(kv, row).astype(pool.dtype) for row in rows])
