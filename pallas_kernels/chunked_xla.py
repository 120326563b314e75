"""Ragged paged attention in plain XLA, chunked over keys with an online softmax (the CPU backend).

Same contract as `reference.ragged_paged_attention_reference` (same arguments,
same outputs within float32 rounding), but shaped for a CPU:

- Keys are visited in chunks of `kv_chunk` tokens (whole blocks): one chunk of
  every sequence's blocks is gathered from the pool at a time, so there is no
  full-context copy, and a running max / denominator / accumulator carries the
  softmax across chunks (flash attention).
- The chunk loop is a `fori_loop` whose trip count is data-dependent: it stops
  at the last key any query of the tile can see, so neither the padded tail of
  the block table nor keys past a query tile's causal limit cost anything.
- Prefill queries are cut into tiles of `query_tile` rows; tile `t` only walks
  the chunks its own queries reach, so a long prefill does about half the
  masked work of a full score matrix. A decode batch is one tile of one row.
- Each KV head's `group` query heads are folded into the query rows, so every
  score and value product is a small matmul `[rows * group, D] x [D, chunk]`
  batched over (KV head, sequence).

With a `sliding_window` W, query position p sees keys p - W + 1 .. p only, and
the chunk loop starts at the first chunk holding a key some query of the tile
sees: blocks wholly before the window (freed, possibly reused by another
sequence) are neither read into an output nor, past the first chunk, visited.

Masking is by position, never by pool contents: scores of invisible keys are
replaced by -inf and values past a sequence's context are zeroed before the
weighted sum, so stale or NaN slots never reach an output. Scores, softmax
state and the accumulator are float32; fp8 pools are upcast one chunk at a
time, with `k_scale` folded into the scores and `v_scale` into the output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from pallas_kernels.reference import soft_capped

# One loop step's working set (K and V chunks plus the score tile, float32) is kept
# near this size: on a CPU a chunk that stays in cache runs several times faster than
# one that streams through memory (measured in docs/benchmarks/kernels.md).
CHUNK_BUDGET_BYTES = 512 * 1024
MAX_KV_CHUNK = 512  # keys
PREFILL_QUERY_TILE = 128  # query rows per prefill tile


def choose_chunking(num_seqs: int, num_kv_heads: int, group: int, head_dim: int, block_size: int,
                    max_query_len: int) -> tuple[int, int]:
    """(keys per chunk, query rows per tile) for a step of this shape.

    The chunk is the largest power-of-two number of keys (at least one block, at
    most `MAX_KV_CHUNK`) whose K and V slices and score tile, over every sequence
    and KV head of the step, fit `CHUNK_BUDGET_BYTES`.
    """
    tile = min(PREFILL_QUERY_TILE, max_query_len)
    bytes_per_key = 4 * num_seqs * num_kv_heads * (2 * head_dim + tile * group)
    keys = max(1, CHUNK_BUDGET_BYTES // bytes_per_key)
    keys = 1 << (keys.bit_length() - 1)
    return max(block_size, min(keys, MAX_KV_CHUNK)), tile


def chunked_paged_attention(
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
    kv_chunk: int | None = None,
    query_tile: int | None = None,
) -> Float[Array, "T Hq D"]:
    """Attention of ragged query rows over each sequence's paged context, chunk by chunk.

    Arguments and result as `ragged_paged_attention_reference` (`sliding_window`
    and `soft_cap` included); in addition
    `kv_chunk` (keys per loop step, rounded down to whole blocks, at most the
    block table's width) and `query_tile` (prefill rows per tile) trade loop
    overhead against cache misses and wasted masked work; None picks them with
    `choose_chunking`. Padding rows of the result are zero.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, _, block_size, _ = k_pages.shape
    num_seqs, blocks_per_seq = block_tables.shape
    group = num_q_heads // num_kv_heads
    auto_chunk, auto_tile = choose_chunking(num_seqs, num_kv_heads, group, head_dim, block_size, max_query_len)
    kv_chunk, query_tile = kv_chunk or auto_chunk, query_tile or auto_tile
    chunk_blocks = max(1, min(kv_chunk // block_size, blocks_per_seq))
    num_chunks = -(-blocks_per_seq // chunk_blocks)
    tile = max(1, min(query_tile, max_query_len))
    num_tiles = -(-max_query_len // tile)
    padded_q_len = num_tiles * tile

    # Block tables padded to whole chunks; padded entries are never visible (position mask).
    tables = jnp.pad(block_tables, ((0, 0), (0, num_chunks * chunk_blocks - blocks_per_seq)))
    tables = tables.reshape(num_seqs, num_chunks, chunk_blocks)

    offsets = jnp.arange(padded_q_len)
    rows = query_start[:, None] + offsets[None, :]  # [S, Qp] row of q of each query slot
    row_valid = offsets[None, :] < query_lens[:, None]
    q_pos = (context_lens - query_lens)[:, None] + offsets[None, :]  # [S, Qp]
    # Queries as [Hkv, S, Qp, G, D]: a tile's rows x group fold into one matmul dimension.
    qs = q[jnp.where(row_valid, rows, 0)].reshape(num_seqs, padded_q_len, num_kv_heads, group, head_dim)
    qs = qs.transpose(2, 0, 1, 3, 4).astype(jnp.float32) * sm_scale
    if k_scale is not None:
        qs = qs * k_scale.astype(jnp.float32)[:, None, None, None, None]

    def attend_tile(t, out):
        start = t * tile
        q_tile = jax.lax.dynamic_slice_in_dim(qs, start, tile, axis=2)
        q_tile = q_tile.reshape(num_kv_heads, num_seqs, tile * group, head_dim)
        tile_pos = jax.lax.dynamic_slice_in_dim(q_pos, start, tile, axis=1)
        tile_valid = jax.lax.dynamic_slice_in_dim(row_valid, start, tile, axis=1)
        # Highest key position any real query of this tile sees -> chunks to visit.
        chunk_len = chunk_blocks * block_size
        last_key = jnp.max(jnp.where(tile_valid, tile_pos, -1))
        trip = jnp.minimum((last_key + chunk_len) // chunk_len, num_chunks)
        # Lowest key any real query of each sequence's tile sees (the window's start).
        first_key = jnp.zeros((num_seqs,), jnp.int32)
        first_chunk = 0
        if sliding_window is not None:
            lowest_pos = jnp.min(jnp.where(tile_valid, tile_pos, jnp.iinfo(jnp.int32).max), axis=1)
            first_key = jnp.maximum(lowest_pos - sliding_window + 1, 0)
            first_chunk = jnp.min(first_key) // chunk_len
        acc = _online_softmax(q_tile, jnp.repeat(jnp.where(tile_valid, tile_pos, -1), group, axis=1),
                              k_pages, v_pages, tables, context_lens, first_key, first_chunk, trip,
                              sliding_window, soft_cap)
        acc = acc.reshape(num_kv_heads, num_seqs, tile, group, head_dim).transpose(1, 2, 0, 3, 4)
        return jax.lax.dynamic_update_slice_in_dim(out, acc, start, axis=1)

    out = jnp.zeros((num_seqs, padded_q_len, num_kv_heads, group, head_dim), jnp.float32)
    if num_tiles == 1:
        out = attend_tile(0, out)
    else:
        out = jax.lax.fori_loop(0, num_tiles, attend_tile, out)
    if v_scale is not None:
        out = out * v_scale.astype(jnp.float32)[None, None, :, None, None]
    out = out[:, :max_query_len].reshape(num_seqs * max_query_len, num_q_heads, head_dim).astype(q.dtype)

    scatter_rows = jnp.where(row_valid[:, :max_query_len], rows[:, :max_query_len], num_tokens).reshape(-1)
    result = jnp.zeros((num_tokens, num_q_heads, head_dim), q.dtype)
    return result.at[scatter_rows].set(out, mode="drop")


def _online_softmax(
    q_tile: Float[Array, "Hkv S R D"],
    row_pos: Int[Array, "S R"],
    k_pages: Float[Array, "Hkv N B D"],
    v_pages: Float[Array, "Hkv N B D"],
    tables: Int[Array, "S C Mc"],
    context_lens: Int[Array, "S"],
    first_key: Int[Array, "S"],
    first_chunk: Int[Array, ""] | int,
    trip: Int[Array, ""],
    sliding_window: int | None,
    soft_cap: float | None = None,
) -> Float[Array, "Hkv S R D"]:
    """Softmax-weighted values of key chunks `first_chunk .. trip` for one query tile (rows at `row_pos`, -1 = none).

    `q_tile` is already scaled (the cap applies to the scaled scores); rows that see no key come out zero. Keys below a
    sequence's `first_key` (before its sliding window) are masked like keys past its context.
    """
    num_kv_heads, num_seqs, num_rows, head_dim = q_tile.shape
    block_size = k_pages.shape[2]
    chunk_blocks = tables.shape[2]
    chunk_len = chunk_blocks * block_size

    def body(c, carry):
        running_max, denom, acc = carry
        blocks = tables[:, c]  # [S, Mc]
        k = k_pages[:, blocks].reshape(num_kv_heads, num_seqs, chunk_len, head_dim).astype(jnp.float32)
        v = v_pages[:, blocks].reshape(num_kv_heads, num_seqs, chunk_len, head_dim).astype(jnp.float32)
        key_pos = c * chunk_len + jnp.arange(chunk_len)
        in_context = (key_pos[None, :] < context_lens[:, None]) & (key_pos[None, :] >= first_key[:, None])  # [S, Ck]
        visible = (key_pos[None, None, :] <= row_pos[:, :, None]) & in_context[:, None, :]  # [S, R, Ck]
        if sliding_window is not None:
            visible = visible & (key_pos[None, None, :] > row_pos[:, :, None] - sliding_window)
        # v is masked too: 0 * NaN would otherwise leak a poisoned slot into the sum.
        v = jnp.where(in_context[None, :, :, None], v, 0.0)
        scores = soft_capped(jnp.einsum("hsrd,hscd->hsrc", q_tile, k), soft_cap)
        scores = jnp.where(visible[None], scores, -jnp.inf)
        new_max = jnp.maximum(running_max, jnp.max(scores, axis=-1))
        safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
        weights = jnp.exp(scores - safe_max[..., None])  # exp(-inf) = 0 for invisible keys
        rescale = jnp.exp(running_max - safe_max)  # 0 while nothing was visible before
        denom = denom * rescale + jnp.sum(weights, axis=-1)
        acc = acc * rescale[..., None] + jnp.einsum("hsrc,hscd->hsrd", weights, v)
        return new_max, denom, acc

    init = (
        jnp.full((num_kv_heads, num_seqs, num_rows), -jnp.inf, jnp.float32),
        jnp.zeros((num_kv_heads, num_seqs, num_rows), jnp.float32),
        jnp.zeros((num_kv_heads, num_seqs, num_rows, head_dim), jnp.float32),
    )
    if tables.shape[1] == 1:  # the whole table is one chunk: no loop (a query-less tile just masks it all)
        _, denom, acc = body(0, init)
    else:
        _, denom, acc = jax.lax.fori_loop(first_chunk, trip, body, init)
    return acc / jnp.where(denom > 0, denom, 1.0)[..., None]
