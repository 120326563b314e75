"""Pure-JAX ragged paged attention: the reference every other backend is tested against.

Pool layout (one layer): K and V are `[num_kv_heads, num_blocks, block_size, head_dim]`,
head-major like JAX's own paged kernels, so the gather for one KV head reads
contiguous `[block_size, head_dim]` tiles.

A step's queries are ragged: sequence `s` owns `query_lens[s]` consecutive rows of
`q` starting at `query_start[s]`. Its context after this step holds
`context_lens[s]` tokens (the queries included, already written to the pool), so
query `i` sits at position `context_lens[s] - query_lens[s] + i` and attends
causally to keys `0 ..` that position. A decode is `query_lens[s] == 1`; a prefill
chunk is several queries attending to the context cached so far plus themselves.

With a `sliding_window` W, query position p sees only keys p - W + 1 .. p (Hugging
Face's and vLLM's convention: W keys, itself included); blocks wholly before the
window may have been freed and reused, and are never read into an output.

Masking is by position, never by pool contents: stale data (or NaN) in slots a
sequence does not own never reaches an output.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def ragged_paged_attention_reference(
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
) -> Float[Array, "T Hq D"]:
    """Attention of ragged query rows over each sequence's paged context.

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
      sliding_window: static window W (keys p - W + 1 .. p are visible), or None for full attention.
      soft_cap: static logit soft cap c (Gemma 2's `attn_logit_softcapping`): the scaled scores s
        become `c * tanh(s / c)` before masking and softmax. None: no cap.

    Returns:
      `[T, num_q_heads, head_dim]` in `q.dtype`; padding rows are zero.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, _, block_size, _ = k_pages.shape
    num_seqs, blocks_per_seq = block_tables.shape
    group = num_q_heads // num_kv_heads
    ctx = blocks_per_seq * block_size

    # Per-sequence query tiles [S, Qmax]: row index into q, and whether it is real.
    offsets = jnp.arange(max_query_len)
    rows = query_start[:, None] + offsets[None, :]
    row_valid = offsets[None, :] < query_lens[:, None]
    rows = jnp.where(row_valid, rows, 0)
    qs = q[rows].reshape(num_seqs, max_query_len, num_kv_heads, group, head_dim)

    k = _gather_context(k_pages, block_tables, k_scale)  # [Hkv, S, C, D] float32
    v = _gather_context(v_pages, block_tables, v_scale)

    scores = soft_capped(jnp.einsum("sqhgd,hscd->shgqc", qs.astype(jnp.float32), k) * sm_scale, soft_cap)
    q_pos = (context_lens - query_lens)[:, None] + offsets[None, :]  # [S, Qmax]
    k_pos = jnp.arange(ctx)
    visible = (k_pos[None, None, :] <= q_pos[:, :, None]) & row_valid[:, :, None]
    visible = visible & (k_pos[None, None, :] < context_lens[:, None, None])  # [S, Qmax, C]
    # Keys any query of the sequence may see: [first visible, context end).
    first_key = jnp.zeros_like(context_lens)
    if sliding_window is not None:
        visible = visible & (k_pos[None, None, :] > q_pos[:, :, None] - sliding_window)
        first_key = jnp.maximum(context_lens - query_lens - sliding_window + 1, 0)
    scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
    max_score = jnp.max(scores, axis=-1, keepdims=True)
    max_score = jnp.where(jnp.isfinite(max_score), max_score, 0.0)
    weights = jnp.where(visible[:, None, None], jnp.exp(scores - max_score), 0.0)
    denom = jnp.sum(weights, axis=-1, keepdims=True)
    probs = weights / jnp.where(denom > 0, denom, 1.0)
    # v is masked too: 0 * NaN would otherwise leak a poisoned slot into the sum.
    owned = (k_pos[None, :] < context_lens[:, None]) & (k_pos[None, :] >= first_key[:, None])  # [S, C]
    v = jnp.where(owned[None, :, :, None], v, 0.0)
    out = jnp.einsum("shgqc,hscd->sqhgd", probs, v)
    out = out.reshape(num_seqs * max_query_len, num_q_heads, head_dim).astype(q.dtype)

    scatter_rows = jnp.where(row_valid, rows, num_tokens).reshape(-1)
    result = jnp.zeros((num_tokens, num_q_heads, head_dim), q.dtype)
    return result.at[scatter_rows].set(out, mode="drop")


def _gather_context(
    pages: Float[Array, "Hkv N B D"],
    block_tables: Int[Array, "S M"],
    scale: Float[Array, "Hkv"] | None,
) -> Float[Array, "Hkv S C D"]:
    """Gather each sequence's blocks into a contiguous float32 context (dequantised)."""
    num_kv_heads, _, block_size, head_dim = pages.shape
    num_seqs, blocks_per_seq = block_tables.shape
    gathered = pages[:, block_tables]  # [Hkv, S, M, B, D]
    gathered = gathered.reshape(num_kv_heads, num_seqs, blocks_per_seq * block_size, head_dim)
    gathered = gathered.astype(jnp.float32)
    if scale is not None:
        gathered = gathered * scale.astype(jnp.float32)[:, None, None, None]
    return gathered


def soft_capped(scores: Float[Array, "..."], soft_cap: float | None) -> Float[Array, "..."]:
    """`soft_cap * tanh(scores / soft_cap)` (Gemma's attention logit soft-capping); `scores` if None."""
    if soft_cap is None:
        return scores
    return soft_cap * jnp.tanh(scores / soft_cap)


def check_soft_cap(soft_cap: float | None) -> None:
    """ValueError unless `soft_cap` is None or a positive number (a static kernel argument)."""
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap must be positive or None, got {soft_cap}")
