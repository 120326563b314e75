"""Launch parameters for the Mosaic GPU ragged paged-attention kernel, from static shapes.

The heuristic, in order (Hopper: one warpgroup per CTA, ~227 KiB shared memory):

1. Query rows per CTA are fixed at `ROWS = 64`, the M of one warpgroup's WGMMA:
   `64 // padded_group` query slots of one sequence, times the group heads that
   share the KV head (a decode fills `padded_group` of the 64 rows; the rest are
   masked, the price of reading each K/V block once for the whole group).
2. Keys per pipeline step `N = pages_per_step * block_size`, a multiple of 64 (the
   WGMMA K of the P @ V product with a 128-byte swizzle): 128 for decode with
   `head_dim <= 128` (bigger TMA batches in flight per step), 64 otherwise.
3. Pipeline depth `num_stages`: as many K/V buffers as fit in `SMEM_BUDGET`
   after the Q tile, the float32 output tile and the P tile (plus, for fp8, the
   converted K/V pair), between 2 and 4.
4. Splits of the block table (flash-decoding): `tuning.py`'s rule over these query
   tiles, i.e. enough CTAs for its `TARGET_PROGRAMS`, each split keeping at least
   `MIN_TOKENS_PER_SPLIT` keys.
"""

from __future__ import annotations

import dataclasses

from pallas_kernels.tuning import choose_launch_params, next_power_of_2

ROWS = 64
MIN_KEYS_PER_STEP = 64
SMEM_BUDGET = 200 * 1024


@dataclasses.dataclass(frozen=True)
class MosaicLaunchParams:
    """Static launch parameters of one `ragged_paged_attention_mgpu` call."""

    queries_per_block: int
    pages_per_step: int
    num_splits: int
    num_stages: int


def choose_mosaic_launch_params(
    *,
    num_seqs: int,
    num_kv_heads: int,
    group: int,
    max_query_len: int,
    blocks_per_seq: int,
    block_size: int,
    head_dim: int,
    kv_itemsize: int,
    compute_itemsize: int,
    pages_per_step: int | None = None,
    num_splits: int | None = None,
    num_stages: int | None = None,
) -> MosaicLaunchParams:
    """Fill every launch parameter left as None by the heuristic in the module docstring.

    Raises:
      ValueError: if `group` exceeds the 64 rows of a tile, or an override breaks
        the 64-keys-per-step rule.
    """
    padded_group = next_power_of_2(group)
    if padded_group > ROWS:
        raise ValueError(f"query heads per KV head must be <= {ROWS}, got {group}")
    queries_per_block = ROWS // padded_group
    decode = max_query_len == 1
    if pages_per_step is None:
        target_keys = 128 if decode and head_dim <= 128 else MIN_KEYS_PER_STEP
        pages_per_step = max(1, target_keys // block_size)
    if (pages_per_step * block_size) % MIN_KEYS_PER_STEP:
        raise ValueError(
            f"pages_per_step * block_size must be a multiple of {MIN_KEYS_PER_STEP}, "
            f"got {pages_per_step} * {block_size}")
    if num_stages is None:
        keys = pages_per_step * block_size
        # Q tile, float32 output tile, the P tile of P @ V.
        fixed = ROWS * head_dim * (compute_itemsize + 4) + ROWS * keys * compute_itemsize
        per_stage = 2 * keys * head_dim * kv_itemsize
        if kv_itemsize != compute_itemsize:  # fp8: one converted K/V pair beside the stages
            fixed += 2 * keys * head_dim * compute_itemsize
        num_stages = max(2, min(4, (SMEM_BUDGET - fixed) // per_stage))
    if num_splits is None:  # the Triton kernel's rule, for this kernel's query tiles
        num_splits = choose_launch_params(
            num_seqs=num_seqs, num_kv_heads=num_kv_heads, group=group, max_query_len=max_query_len,
            blocks_per_seq=blocks_per_seq, block_size=block_size, queries_per_block=queries_per_block,
            pages_per_compute_block=1, num_warps=4, num_stages=2,
        ).num_splits
    return MosaicLaunchParams(queries_per_block, pages_per_step, num_splits, num_stages)
