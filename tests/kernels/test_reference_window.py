"""The reference's sliding window against a plain-numpy windowed attention.

Blocks wholly before each sequence's window are NaN-poisoned (as if freed and
reused), so a reference that read them would return NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.reference import ragged_paged_attention_reference
from tests.kernels.paged_batches import HEAD_DIM, make_batch

BLOCK = 8


def numpy_windowed_attention(q, k_pages, v_pages, tables, context_lens, query_start, query_lens, window,
                             soft_cap=None):
    """Per query: softmax over keys max(0, p - window + 1) .. p, read through the block table
    (scores capped at ``soft_cap * tanh(s / soft_cap)`` when given)."""
    q, k_pages, v_pages = (np.asarray(x, np.float64) for x in (q, k_pages, v_pages))
    num_kv, _, block, dim = k_pages.shape
    group = q.shape[1] // num_kv
    out = np.zeros_like(q)
    for s, (ctx, start, n) in enumerate(zip(context_lens, query_start, query_lens)):
        for i in range(int(n)):
            pos = int(ctx) - int(n) + i
            keys = range(max(0, pos - window + 1) if window else 0, pos + 1)
            blocks = [int(tables[s, j // block]) for j in keys]
            for h in range(q.shape[1]):
                k = np.stack([k_pages[h // group, b, j % block] for b, j in zip(blocks, keys)])
                v = np.stack([v_pages[h // group, b, j % block] for b, j in zip(blocks, keys)])
                scores = k @ q[start + i, h] * dim**-0.5
                if soft_cap is not None:
                    scores = soft_cap * np.tanh(scores / soft_cap)
                p = np.exp(scores - scores.max())
                out[start + i, h] = (p / p.sum()) @ v
    return out


def poison_before_window(batch, window):
    """NaN every block that lies wholly before the earliest key any of a sequence's queries sees."""
    q, k_pages, v_pages, tables, ctx, _, qlens = (np.asarray(a) for a in batch.args)
    k_pages, v_pages = k_pages.copy(), v_pages.copy()
    for s in range(tables.shape[0]):
        first_key = max(0, int(ctx[s]) - int(qlens[s]) - window + 1)
        for j in range(first_key // BLOCK):
            k_pages[:, tables[s, j]] = np.nan
            v_pages[:, tables[s, j]] = np.nan
    batch.args = (batch.args[0], jnp.asarray(k_pages), jnp.asarray(v_pages), *batch.args[3:])
    return batch


@pytest.mark.parametrize("window", [1, BLOCK - 1, BLOCK, BLOCK + 1, 20])
def test_windowed_reference_matches_numpy(window):
    # Decodes and prefill chunks, contexts at and across window and block edges.
    context_lens = [1, window, window + 3, 45, 60]
    query_lens = [1, 1, 3, 9, 17]
    batch = poison_before_window(make_batch(context_lens, query_lens, block_size=BLOCK, group=2, seed=window), window)
    actual = np.asarray(jax.jit(ragged_paged_attention_reference, static_argnames=(
        "max_query_len", "sm_scale", "sliding_window"))(*batch.args, max_query_len=batch.max_query_len,
                                                        sm_scale=HEAD_DIM**-0.5, sliding_window=window))
    assert not np.isnan(actual).any()
    expected = numpy_windowed_attention(*batch.args, window)
    np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=2e-5)


def test_window_wider_than_context_is_full_attention():
    batch = make_batch([5, 30], [2, 7], block_size=BLOCK, group=1)
    full = batch.run(ragged_paged_attention_reference)
    windowed = batch.run(ragged_paged_attention_reference, sliding_window=64)
    np.testing.assert_array_equal(np.asarray(full), np.asarray(windowed))
