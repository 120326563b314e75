"""Converting blocks between the runner's transfer layout and a snapshot's per-layer arrays.

The runner moves blocks (`read_blocks`, `write_blocks`: one padded gather or
one donated scatter per call) as `[2, num_layers, num_kv_heads, block_size,
head_dim]`; a snapshot stores them as rows of per-layer `[num_kv_heads, n,
block_size, head_dim]` arrays. This module converts between the two.
"""

from __future__ import annotations

import numpy as np


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
