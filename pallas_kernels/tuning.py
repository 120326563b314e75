"""Launch parameters for the ragged paged-attention kernel, chosen from static shapes.

The heuristic, in order:

1. Query rows per program `M = queries_per_block * padded_group`. Triton's `dot`
   needs `M >= 16`, so a decode (one query) still runs 16 rows: `16 / group` query
   slots per sequence, the extra ones masked. A prefill tile aims at `M = 64`
   (`128` for long chunks), which keeps the float32 accumulator `[M, head_dim]` in
   registers with 4-8 warps. Never more slots than the `max_query_len` bucket
   (rounded up to a power of two) needs.
2. Keys per inner iteration `N = pages_per_compute_block * block_size`: 128 tokens
   for decode (one big gathered K/V tile per loop trip amortises the block-table
   load and softmax bookkeeping), 64 for prefill (the `[M, N]` score tile must fit
   beside the accumulator). At least 16 (Triton `dot`), at most the table width.
3. Splits of the block table (flash-decoding): enough programs to fill the GPU.
   `kv_heads * sequences * query_tiles` programs exist without splitting; splits
   multiply that up to `TARGET_PROGRAMS` (4 waves of a 132-SM H100/H200), but each
   split keeps at least `MIN_TOKENS_PER_SPLIT` keys, so short contexts never split.
4. `num_warps` 4, or 8 once the tile has `M * N >= 128 * 64` scores;
   `num_stages` 2 (double-buffer the gathered K/V tile; deeper costs shared memory
   that the gather cannot use well).
"""

from __future__ import annotations

import dataclasses

TARGET_PROGRAMS = 4 * 132
MIN_TOKENS_PER_SPLIT = 512
MIN_DOT_DIM = 16


@dataclasses.dataclass(frozen=True)
class LaunchParams:
    """Static launch parameters of one `ragged_paged_attention` call."""

    queries_per_block: int
    pages_per_compute_block: int
    num_splits: int
    num_warps: int
    num_stages: int


def next_power_of_2(x: int) -> int:
    """Smallest power of two >= `x` (1 for `x <= 1`)."""
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def choose_launch_params(
    *,
    num_seqs: int,
    num_kv_heads: int,
    group: int,
    max_query_len: int,
    blocks_per_seq: int,
    block_size: int,
    queries_per_block: int | None = None,
    pages_per_compute_block: int | None = None,
    num_splits: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> LaunchParams:
    """Fill every launch parameter left as None by the heuristic in the module docstring."""
    padded_group = next_power_of_2(group)
    decode = max_query_len == 1
    if queries_per_block is None:
        target_rows = MIN_DOT_DIM if decode else (128 if max_query_len >= 256 else 64)
        rows_wanted = max(MIN_DOT_DIM, min(target_rows, next_power_of_2(max_query_len) * padded_group))
        queries_per_block = max(1, rows_wanted // padded_group)
    if pages_per_compute_block is None:
        target_keys = 128 if decode else 64
        pages = max(target_keys, MIN_DOT_DIM) // block_size
        pages_per_compute_block = max(1, min(pages, next_power_of_2(blocks_per_seq)))
        pages_per_compute_block = max(pages_per_compute_block, -(-MIN_DOT_DIM // block_size))
    if num_splits is None:
        query_tiles = -(-max_query_len // queries_per_block)
        programs = num_seqs * num_kv_heads * query_tiles
        by_occupancy = next_power_of_2(-(-TARGET_PROGRAMS // max(programs, 1)))
        by_length = max(1, (blocks_per_seq * block_size) // MIN_TOKENS_PER_SPLIT)
        num_splits = max(1, min(by_occupancy, by_length))
    if num_warps is None:
        rows = queries_per_block * padded_group
        keys = pages_per_compute_block * block_size
        num_warps = 8 if rows * keys >= 128 * 64 else 4
    if num_stages is None:
        num_stages = 2
    return LaunchParams(queries_per_block, pages_per_compute_block, num_splits, num_warps, num_stages)
