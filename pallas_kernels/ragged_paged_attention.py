"""Pallas GPU kernel: ragged paged attention (decode + chunked prefill), GQA, split-K, fp8 K/V.

Same contract as `pallas_kernels.reference.ragged_paged_attention_reference` (its
pure-JAX reference, beside it): pool `[num_kv_heads, num_blocks, block_size, head_dim]`,
ragged query rows, causal attention at positions `context_lens - query_lens + i`.

How the work is cut:

- The wrapper gathers each sequence's queries into fixed tiles
  `[num_kv_heads, S, query_slots * padded_group, head_dim]`: a program owns one KV
  head, one tile of `queries_per_block` queries of one sequence, and *all* the query
  heads that share that KV head (GQA: one K/V load serves `group` heads, its rows
  ordered query-major, head-minor).
- Grid `(num_kv_heads, S * query_tiles, num_splits)`. Split `k` walks its slice of the
  sequence's block table `pages_per_compute_block` pages at a time, gathering those
  pages straight out of the pool (no contiguous copy) and running an online softmax
  in float32. It stops at the last key the tile can see (context length, causality),
  so padding blocks and the pool beyond each context are never used; NaN there is
  masked out of both the scores and V. With a sliding window it also starts at the
  first compute block holding a key the tile can see, so pages that slid out (freed by
  the hybrid KV cache manager, possibly reused) are never loaded.
- Each split writes its normalised output with its running max and sum; a small jnp
  merge (flash-decoding) combines the splits stably, then the wrapper scatters the
  rows back to `[T, num_q_heads, head_dim]` (padding rows zero).
- fp8 (float8_e4m3fn) pools are cast to the query dtype on load (exact into bf16/f32);
  the per-KV-head scales are scalars, so `k_scale` multiplies the float32 scores and
  `v_scale` the output, which equals dequantising every element on load.

Lowering: Pallas' Triton backend (`jax.experimental.pallas.triton`), which both
JAX 0.11.2 and 0.12 ship; the body uses only backend-neutral ops (ref loads, `pl.ds`,
`lax.dot_general`, jnp), so `interpret=True` runs it on CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float, Int

from pallas_kernels.reference import check_soft_cap, soft_capped
from pallas_kernels.tuning import LaunchParams, choose_launch_params, next_power_of_2

# Finite, so a fully masked row keeps `exp(m_prev - m_next)` at 1 instead of NaN.
MASK_VALUE = -1e30


@functools.partial(
    jax.jit,
    static_argnames=(
        "max_query_len", "sm_scale", "sliding_window", "soft_cap", "interpret", "queries_per_block",
        "pages_per_compute_block", "num_splits", "num_warps", "num_stages",
    ),
)
def ragged_paged_attention(
    q: Float[Array, "T Hq D"],
    k_pages: Float[Array, "Hkv N B D"],
    v_pages: Float[Array, "Hkv N B D"],
    block_tables: Int[Array, "S M"],
    context_lens: Int[Array, "S"],
    query_start: Int[Array, "S"],
    query_lens: Int[Array, "S"],
    *,
    max_query_len: int,
    sm_scale: float,
    k_scale: Float[Array, "Hkv"] | None = None,
    v_scale: Float[Array, "Hkv"] | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    interpret: bool = False,
    queries_per_block: int | None = None,
    pages_per_compute_block: int | None = None,
    num_splits: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> Float[Array, "T Hq D"]:
    """Attention of ragged query rows over each sequence's paged context (Pallas kernel).

    Args:
      q: queries, `[T, num_q_heads, head_dim]`; rows not owned by any sequence are padding.
      k_pages, v_pages: one layer's pool, `[num_kv_heads, num_blocks, block_size, head_dim]`,
        float32 / bfloat16, or float8_e4m3fn with `k_scale` / `v_scale`.
      block_tables: `[S, M]` physical block of each sequence's logical block `j`.
      context_lens: `[S]` tokens in each context after this step (0 for padding sequences).
      query_start: `[S]` row of `q` holding each sequence's first query.
      query_lens: `[S]` queries of each sequence this step (0 for padding sequences).
      max_query_len: static bound on `query_lens` (a bucket); 1 for a decode batch.
      sm_scale: softmax scale, usually `head_dim ** -0.5`.
      k_scale, v_scale: `[num_kv_heads]` float32 dequantisation scales for fp8 pools.
      sliding_window: static window W: the query at position p sees keys p - W + 1 .. p
        only, and each program starts at the first page its rows can see (pages before
        it, which the host may have freed and reused, are never loaded). None: full.
      soft_cap: static logit soft cap c: scaled scores s become `c * tanh(s / c)` before
        masking (Gemma's `attn_logit_softcapping`). None: no cap.
      interpret: run the kernel in Pallas interpret mode (CPU tests).
      queries_per_block, pages_per_compute_block, num_splits, num_warps, num_stages:
        launch overrides; None picks them with `tuning.choose_launch_params`.

    Returns:
      `[T, num_q_heads, head_dim]` in `q.dtype`; padding rows are zero.
    """
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window must be positive or None, got {sliding_window}")
    check_soft_cap(soft_cap)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, _, block_size, _ = k_pages.shape
    num_seqs, blocks_per_seq = block_tables.shape
    _check_shapes(q, k_pages, v_pages, block_tables, interpret)
    group = num_q_heads // num_kv_heads
    params = choose_launch_params(
        num_seqs=num_seqs,
        num_kv_heads=num_kv_heads,
        group=group,
        max_query_len=max_query_len,
        blocks_per_seq=blocks_per_seq,
        block_size=block_size,
        queries_per_block=queries_per_block,
        pages_per_compute_block=pages_per_compute_block,
        num_splits=num_splits,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    query_tiles = -(-max_query_len // params.queries_per_block)
    query_slots = query_tiles * params.queries_per_block
    compute_dtype = _compute_dtype(q.dtype, k_pages.dtype)

    rows, row_valid = _query_rows(query_start, query_lens, query_slots)
    q_tiles = _gather_query_tiles(q.astype(compute_dtype), rows, num_kv_heads)
    tables = _split_block_table(block_tables, params)
    seq_info = jnp.stack([context_lens, query_lens], axis=1).astype(jnp.int32)
    logit_scale = jnp.full((num_kv_heads,), sm_scale, jnp.float32)
    if k_scale is not None:
        logit_scale = logit_scale * k_scale.astype(jnp.float32)

    out, row_max, row_sum = _paged_attention_call(
        q_tiles, k_pages, v_pages, tables, seq_info, logit_scale[:, None],
        params=params, block_size=block_size, query_tiles=query_tiles,
        padded_group=q_tiles.shape[2] // query_slots, interpret=interpret, sliding_window=sliding_window,
        soft_cap=soft_cap,
    )
    out = merge_splits(out, row_max, row_sum)  # [Hkv, S, slots * Gp, D]
    if v_scale is not None:
        out = out * v_scale.astype(jnp.float32)[:, None, None, None]
    return _scatter_rows(out.astype(q.dtype), rows, row_valid, num_tokens, group)


def _check_shapes(q, k_pages, v_pages, block_tables, interpret: bool) -> None:
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads, _, block_size, pool_head_dim = k_pages.shape
    if k_pages.shape != v_pages.shape:
        raise ValueError(f"k_pages {k_pages.shape} and v_pages {v_pages.shape} differ")
    if pool_head_dim != head_dim or num_q_heads % num_kv_heads:
        raise ValueError(f"q {q.shape} does not fit a pool of shape {k_pages.shape}")
    if block_tables.ndim != 2:
        raise ValueError(f"block_tables must be [S, M], got {block_tables.shape}")
    if not interpret and (head_dim != next_power_of_2(head_dim) or block_size != next_power_of_2(block_size)):
        raise ValueError(f"the GPU kernel needs power-of-two head_dim and block_size, got {head_dim}, {block_size}")


def _compute_dtype(q_dtype, pool_dtype) -> jnp.dtype:
    """Dtype both `dot` operands are cast to: fp8 pools compute in the query dtype."""
    if jnp.dtype(pool_dtype).itemsize == 1:
        return jnp.dtype(q_dtype)
    return jnp.promote_types(q_dtype, pool_dtype)


def _query_rows(
    query_start: Int[Array, "S"], query_lens: Int[Array, "S"], query_slots: int
) -> tuple[Int[Array, "S Q"], Int[Array, "S Q"]]:
    """Row of `q` behind each query slot of each sequence, and whether the slot is real."""
    offsets = jnp.arange(query_slots, dtype=jnp.int32)
    valid = offsets[None, :] < query_lens[:, None]
    rows = jnp.where(valid, query_start[:, None] + offsets[None, :], 0)
    return rows, valid


def _gather_query_tiles(
    q: Float[Array, "T Hq D"], rows: Int[Array, "S Q"], num_kv_heads: int
) -> Float[Array, "Hkv S QG D"]:
    """Per-sequence query tiles, KV-head major, group heads padded to a power of two."""
    num_seqs, query_slots = rows.shape
    _, num_q_heads, head_dim = q.shape
    group = num_q_heads // num_kv_heads
    padded_group = max(next_power_of_2(group), 1)
    tiles = q[rows].reshape(num_seqs, query_slots, num_kv_heads, group, head_dim)
    tiles = jnp.pad(tiles, ((0, 0), (0, 0), (0, 0), (0, padded_group - group), (0, 0)))
    tiles = tiles.transpose(2, 0, 1, 3, 4)
    return tiles.reshape(num_kv_heads, num_seqs, query_slots * padded_group, head_dim)


def _split_block_table(block_tables: Int[Array, "S M"], params: LaunchParams) -> Int[Array, "S M2"]:
    """Pad the table so every split holds a whole number of compute blocks."""
    num_seqs, blocks_per_seq = block_tables.shape
    chunk = params.pages_per_compute_block
    per_split = -(-blocks_per_seq // params.num_splits)
    per_split = -(-per_split // chunk) * chunk
    pad = per_split * params.num_splits - blocks_per_seq
    # Padding entries name block 0; they lie past every context, so they are masked.
    return jnp.pad(block_tables.astype(jnp.int32), ((0, 0), (0, pad)))


def _paged_attention_call(
    q_tiles, k_pages, v_pages, tables, seq_info, logit_scale, *,
    params: LaunchParams, block_size: int, query_tiles: int, padded_group: int, interpret: bool,
    sliding_window: int | None = None, soft_cap: float | None = None,
):
    """The `pallas_call`: per-split normalised output `[splits, Hkv, S, slots*Gp, D]` f32,
    plus running max and sum `[splits, Hkv, S, slots*Gp]`."""
    num_kv_heads, num_seqs, slot_rows, head_dim = q_tiles.shape
    _, num_blocks, _, _ = k_pages.shape
    splits = params.num_splits
    blocks_per_split = tables.shape[1] // splits
    tile_rows = params.queries_per_block * padded_group
    grid = (num_kv_heads, num_seqs * query_tiles, splits)

    def seq_of(i):
        return i // query_tiles

    def tile_of(i):
        return i % query_tiles

    kernel = functools.partial(
        _attention_kernel,
        group=padded_group,
        queries_per_block=params.queries_per_block,
        query_tiles=query_tiles,
        pages_per_compute_block=params.pages_per_compute_block,
        blocks_per_split=blocks_per_split,
        block_size=block_size,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
    )
    pool_spec = pl.BlockSpec((None, num_blocks, block_size, head_dim), lambda h, i, k: (h, 0, 0, 0))
    in_specs = [
        pl.BlockSpec((None, 2), lambda h, i, k: (seq_of(i), 0)),  # seq_info
        pl.BlockSpec((None, 1), lambda h, i, k: (h, 0)),  # logit_scale
        pl.BlockSpec((None, blocks_per_split), lambda h, i, k: (seq_of(i), k)),  # tables
        pl.BlockSpec((None, None, tile_rows, head_dim), lambda h, i, k: (h, seq_of(i), tile_of(i), 0)),
        pool_spec,
        pool_spec,
    ]
    stat_spec = pl.BlockSpec((None, None, None, tile_rows), lambda h, i, k: (k, h, seq_of(i), tile_of(i)))
    out_specs = [
        pl.BlockSpec((None, None, None, tile_rows, head_dim), lambda h, i, k: (k, h, seq_of(i), tile_of(i), 0)),
        stat_spec,
        stat_spec,
    ]
    stat_shape = jax.ShapeDtypeStruct((splits, num_kv_heads, num_seqs, slot_rows), jnp.float32)
    out_shape = [
        jax.ShapeDtypeStruct((splits, num_kv_heads, num_seqs, slot_rows, head_dim), jnp.float32),
        stat_shape,
        stat_shape,
    ]
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=params.num_warps, num_stages=params.num_stages),
        interpret=interpret,
        name="ragged_paged_attention",
    )(seq_info, logit_scale, tables, q_tiles, k_pages, v_pages)


def _attention_kernel(
    seq_ref, scale_ref, table_ref, q_ref, k_ref, v_ref,  # inputs
    o_ref, max_ref, sum_ref,  # outputs
    *, group, queries_per_block, query_tiles, pages_per_compute_block, blocks_per_split, block_size,
    sliding_window=None, soft_cap=None,
):
    """One (KV head, query tile, split): online softmax over the split's pages.

    Refs: seq_ref `[2]` (context_len, query_len); scale_ref `[1]`; table_ref
    `[blocks_per_split]`; q_ref `[tile_rows, D]`; k_ref/v_ref `[N, B, D]` (this head's
    pool); o_ref `[tile_rows, D]`; max_ref/sum_ref `[tile_rows]`.
    """
    tile_rows, head_dim = q_ref.shape
    keys_per_step = pages_per_compute_block * block_size
    context_len, query_len = seq_ref[0], seq_ref[1]
    first_query = (pl.program_id(1) % query_tiles) * queries_per_block
    first_block = pl.program_id(2) * blocks_per_split

    query_index = first_query + jnp.arange(tile_rows, dtype=jnp.int32) // group
    row_valid = query_index < query_len
    query_pos = context_len - query_len + query_index  # [tile_rows]

    # Keys [0, kv_end) are visible to some row of this tile.
    last_query = jnp.minimum(first_query + queries_per_block, query_len)
    kv_end = jnp.where(first_query < query_len, context_len - query_len + last_query, 0)
    end_block = jnp.minimum(first_block + blocks_per_split, pl.cdiv(kv_end, block_size))
    num_steps = pl.cdiv(jnp.maximum(end_block - first_block, 0), pages_per_compute_block)
    # With a window, keys before kv_start are visible to no row of this tile: start at the
    # compute block holding kv_start (aligned, so every page slice stays in the split's table).
    kv_start = 0
    first_step = 0
    if sliding_window is not None:
        kv_start = jnp.maximum(context_len - query_len + first_query - sliding_window + 1, 0)
        first_step = jnp.maximum(kv_start // block_size - first_block, 0) // pages_per_compute_block
        first_step = jnp.minimum(first_step, num_steps)

    q = q_ref[...]
    logit_scale = scale_ref[0]

    def step(i, carry):
        out, row_max, row_sum = carry
        local_block = i * pages_per_compute_block
        pages = table_ref[pl.ds(local_block, pages_per_compute_block)]
        k = k_ref[pages].reshape(keys_per_step, head_dim).astype(q.dtype)
        v = v_ref[pages].reshape(keys_per_step, head_dim).astype(q.dtype)
        key_pos = (first_block + local_block) * block_size + jnp.arange(keys_per_step, dtype=jnp.int32)

        scores = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        visible = (key_pos[None, :] <= query_pos[:, None]) & row_valid[:, None]
        if sliding_window is not None:
            visible = visible & (key_pos[None, :] > query_pos[:, None] - sliding_window)
        scores = jnp.where(visible, soft_capped(scores * logit_scale, soft_cap), MASK_VALUE)
        new_max = jnp.maximum(row_max, scores.max(axis=1))
        probs = jnp.where(visible, jnp.exp(scores - new_max[:, None]), 0.0)
        correction = jnp.exp(row_max - new_max)
        # Slots past the context may hold NaN; 0 * NaN would leak into the sum.
        # So may pages before the window (freed, or block 0 standing in for them).
        v = jnp.where(((key_pos < context_len) & (key_pos >= kv_start))[:, None], v, jnp.zeros_like(v))
        pv = lax.dot(probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return out * correction[:, None] + pv, new_max, row_sum * correction + probs.sum(axis=1)

    init = (
        jnp.zeros((tile_rows, head_dim), jnp.float32),
        jnp.full((tile_rows,), MASK_VALUE, jnp.float32),
        jnp.zeros((tile_rows,), jnp.float32),
    )
    out, row_max, row_sum = lax.fori_loop(first_step, num_steps, step, init)
    o_ref[...] = out / jnp.where(row_sum > 0, row_sum, 1.0)[:, None]
    max_ref[...] = row_max
    sum_ref[...] = row_sum


def merge_splits(
    out: Float[Array, "K *rows D"], row_max: Float[Array, "K *rows"], row_sum: Float[Array, "K *rows"]
) -> Float[Array, "*rows D"]:
    """Combine per-split normalised outputs (flash-decoding), stably in float32.

    Each split `k` holds `out_k = sum_j p_kj v_j / l_k` with scores shifted by `m_k`;
    the whole is `sum_k w_k l_k out_k / sum_k w_k l_k` with `w_k = exp(m_k - max_k m_k)`.
    Rows no split saw (padding) come out zero.
    """
    if out.shape[0] == 1:
        return out[0]
    weights = jnp.exp(row_max - row_max.max(axis=0, keepdims=True)) * row_sum
    total = weights.sum(axis=0)
    merged = jnp.einsum("k...,k...d->...d", weights, out)
    return merged / jnp.where(total > 0, total, 1.0)[..., None]


def _scatter_rows(
    out: Float[Array, "Hkv S QG D"], rows: Int[Array, "S Q"], row_valid, num_tokens: int, group: int
) -> Float[Array, "T Hq D"]:
    """Put each tile row back at its row of `q`; padding rows stay zero."""
    num_kv_heads, num_seqs, slot_rows, head_dim = out.shape
    query_slots = rows.shape[1]
    padded_group = slot_rows // query_slots
    out = out.reshape(num_kv_heads, num_seqs, query_slots, padded_group, head_dim)[:, :, :, :group]
    out = out.transpose(1, 2, 0, 3, 4).reshape(num_seqs * query_slots, num_kv_heads * group, head_dim)
    target = jnp.where(row_valid, rows, num_tokens).reshape(-1)
    result = jnp.zeros((num_tokens, num_kv_heads * group, head_dim), out.dtype)
    return result.at[target].set(out, mode="drop")
