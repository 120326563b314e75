"""KV cache groups: which layers share a block table, and which pool tensor each layer writes.

As vLLM's hybrid KV cache manager (``kv_cache_utils``): layers of one attention
type (full, or a sliding window of W tokens) form groups of equal size
``group_size`` (the smallest type's layer count; a type with more layers is
split into several groups, the last one padded). Every group has its own block
table per sequence, but all groups draw from one block-id space with one page
size, and the pool holds only ``group_size`` K/V tensors: tensor ``j`` is
shared by the ``j``-th layer of every group. A block id in group ``g``'s table
means "layer ``j`` of group ``g`` keeps this page in tensor ``j``", so a block
belongs to one group at a time and a sliding-window group that frees blocks
really returns bytes to the pool.

A model whose layers are all full attention is one group of every layer: the
pool and tables are exactly the single-group layout, and ``KVCacheManager``
takes its unitary path (the plain chained hashes as keys, one table).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxpaged.mathutils import cdiv


@dataclasses.dataclass(frozen=True)
class KVCacheGroup:
    """One KV cache group: an attention window (None: full) and its layers, in pool-tensor order."""

    window: int | None
    layers: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class KVCacheLayout:
    """The groups of a model and where each layer's K/V lives.

    Attributes:
      groups: full-attention groups first, then sliding ones by window, each in layer order.
      layer_group: the group of each layer.
      layer_tensor: the pool tensor each layer reads and writes (its index within its group).
      num_tensors: K (and V) tensors in the pool: the largest group's size.
    """

    groups: tuple[KVCacheGroup, ...]
    layer_group: tuple[int, ...]
    layer_tensor: tuple[int, ...]
    num_tensors: int

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Each group's window (None: full attention), in group order."""
        return tuple(group.window for group in self.groups)

    @property
    def is_hybrid(self) -> bool:
        """Whether any group has a sliding window (so blocks can slide out)."""
        return any(w is not None for w in self.windows)


def kv_cache_layout(layer_windows: tuple[int | None, ...]) -> KVCacheLayout:
    """Group layers by window (vLLM's uniform-page-size grouping) from each layer's window."""
    if not layer_windows:
        raise ValueError("a model needs at least one layer")
    by_window: dict[int | None, list[int]] = {}
    for layer, window in enumerate(layer_windows):
        by_window.setdefault(window, []).append(layer)
    order = ([None] if None in by_window else []) + sorted(w for w in by_window if w is not None)
    group_size = min(len(layers) for layers in by_window.values())
    groups = []
    for window in order:
        layers = by_window[window]
        for start in range(0, cdiv(len(layers), group_size) * group_size, group_size):
            groups.append(KVCacheGroup(window, tuple(layers[start:start + group_size])))
    layer_group = [0] * len(layer_windows)
    layer_tensor = [0] * len(layer_windows)
    for g, group in enumerate(groups):
        for j, layer in enumerate(group.layers):
            layer_group[layer], layer_tensor[layer] = g, j
    return KVCacheLayout(tuple(groups), tuple(layer_group), tuple(layer_tensor), group_size)


def blocks_for_context(window: int | None, context_len: int, block_size: int) -> int:
    """Blocks one group holds for a sequence of ``context_len`` tokens that has finished its step.

    A full group holds every block; a sliding group only those holding the last
    ``window - 1`` tokens before the next query plus the newest one (what
    ``KVCacheManager`` keeps after freeing the blocks that slid out).
    """
    total = cdiv(context_len, block_size)
    if window is None:
        return total
    return total - max(context_len - window + 1, 0) // block_size


NULL_BLOCK = -1  # a sliding group's table entry whose block slid out of the window
PAD_BLOCK = 0  # what a null entry reads as in the flat table the runner gets


def interleave_tables(tables: Sequence[Sequence[int]], null: int) -> list[int]:
    """One flat table from per-group tables of equal length: entry ``j * G + g`` is ``tables[g][j]``
    (``null`` where it is ``NULL_BLOCK``)."""
    return [null if b == NULL_BLOCK else b for column in zip(*tables) for b in column]


def group_key(block_hash: bytes, group: int) -> bytes:
    """The prefix-cache key of a block hash in KV cache group ``group`` (group 0 keeps the plain hash)."""
    return block_hash if group == 0 else block_hash + group.to_bytes(2, "little")


def split_group_key(key: bytes, digest_len: int) -> tuple[bytes, int]:
    """The block hash and group of a :func:`group_key` (``digest_len``: the plain hash's length)."""
    return key[:digest_len], int.from_bytes(key[digest_len:], "little") if len(key) > digest_len else 0
