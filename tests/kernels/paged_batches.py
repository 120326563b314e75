"""Ragged attention steps over a NaN-poisoned paged pool: the inputs the kernel tests share."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

NUM_KV_HEADS = 2
HEAD_DIM = 32
FP8 = jnp.float8_e4m3fn
FP8_SCALES = (0.5, 2.0)


@dataclasses.dataclass
class Batch:
    """One step's inputs, in the reference's argument order, plus the static bounds."""

    args: tuple
    max_query_len: int
    k_scale: jax.Array | None = None
    v_scale: jax.Array | None = None

    def run(self, fn, **kwargs):
        return fn(*self.args, max_query_len=self.max_query_len, sm_scale=HEAD_DIM**-0.5,
                  k_scale=self.k_scale, v_scale=self.v_scale, **kwargs)


def make_batch(
    context_lens, query_lens, *, block_size, group, dtype=jnp.float32, pool_dtype=None,
    num_tokens=None, max_query_len=None, blocks_per_seq=None, seed=0, head_dim=HEAD_DIM,
) -> Batch:
    """A ragged step over a NaN-poisoned pool whose owned blocks sit in random order.

    Padding block-table entries (past a context, or up to a `blocks_per_seq` wider
    than the longest context, as a bucketed step pads them) point at random,
    possibly poisoned blocks; query rows are packed from row 0, with
    `num_tokens - sum(query_lens)` padding rows at the end.
    """
    rng = np.random.default_rng(seed)
    context_lens = np.asarray(context_lens, np.int32)
    query_lens = np.asarray(query_lens, np.int32)
    num_seqs = len(context_lens)
    blocks_per_seq = max(1, -(-int(context_lens.max()) // block_size), blocks_per_seq or 0)
    num_blocks = num_seqs * blocks_per_seq + 3
    physical = rng.permutation(num_blocks)[: num_seqs * blocks_per_seq].reshape(num_seqs, blocks_per_seq)
    tables = rng.integers(0, num_blocks, (num_seqs, blocks_per_seq)).astype(np.int32)

    shape = (NUM_KV_HEADS, num_blocks, block_size, head_dim)
    pools = [np.full(shape, np.nan, np.float32) for _ in range(2)]
    for s, length in enumerate(context_lens):
        used = -(-int(length) // block_size)
        tables[s, :used] = physical[s, :used]
        for j in range(used):
            filled = min(block_size, int(length) - j * block_size)
            for pool in pools:
                pool[:, physical[s, j], :filled] = rng.standard_normal((NUM_KV_HEADS, filled, head_dim))

    k_scale = v_scale = None
    pool_dtype = pool_dtype or dtype
    if pool_dtype == FP8:
        k_scale, v_scale = (jnp.array(FP8_SCALES, jnp.float32) * f for f in (1.0, 0.25))
        pools = [pool / np.asarray(scale)[:, None, None, None] for pool, scale in zip(pools, (k_scale, v_scale))]

    num_tokens = num_tokens or int(query_lens.sum())
    query_start = np.concatenate([[0], np.cumsum(query_lens)[:-1]]).astype(np.int32)
    q = rng.standard_normal((num_tokens, NUM_KV_HEADS * group, head_dim)).astype(np.float32)
    args = (
        jnp.asarray(q, dtype),
        jnp.asarray(pools[0], pool_dtype),
        jnp.asarray(pools[1], pool_dtype),
        jnp.asarray(tables),
        jnp.asarray(context_lens),
        jnp.asarray(query_start),
        jnp.asarray(query_lens),
    )
    bound = max_query_len or int(2 ** np.ceil(np.log2(max(1, query_lens.max()))))
    return Batch(args, bound, k_scale, v_scale)


def boundary_contexts(block_size: int) -> list[int]:
    """Context lengths at, just under and just over block boundaries, 1 to a few hundred."""
    return [1, block_size - 1, block_size, block_size + 1, 3 * block_size, 250]
