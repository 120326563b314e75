"""The Pallas kernel's sliding window against the reference (interpret mode on CPU).

Blocks wholly before each sequence's window are NaN-poisoned (freed and maybe
reused by the hybrid KV cache manager), so a kernel that loads them and lets
them reach a score or a value row fails with NaN. Windows at a block edge and
one either side, chunked prefill whose chunk straddles the window start, GQA,
fp8 pools and launch shapes that make a program start mid-split.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.ragged_paged_attention import ragged_paged_attention
from pallas_kernels.reference import ragged_paged_attention_reference
from tests.kernels.paged_batches import FP8, make_batch
from tests.kernels.test_ragged_paged_attention import COMPILER_OPTIONS, INTERPRET, TOLERANCE
from tests.kernels.test_reference_window import BLOCK, poison_before_window


@functools.cache
def _jitted(fn, **static):
    return jax.jit(functools.partial(fn, **static), compiler_options=COMPILER_OPTIONS)


def _run(fn, batch, window, **launch):
    static = dict(max_query_len=batch.max_query_len, sm_scale=batch.args[0].shape[-1] ** -0.5,
                  sliding_window=window, **launch)
    if fn is ragged_paged_attention:
        static["interpret"] = INTERPRET
    return _jitted(fn, **static)(*batch.args, k_scale=batch.k_scale, v_scale=batch.v_scale)


def _check(batch, window, **launch):
    expected = _run(ragged_paged_attention_reference, batch, window)
    actual = _run(ragged_paged_attention, batch, window, **launch)
    assert not jnp.isnan(actual).any()
    tol = TOLERANCE[batch.args[0].dtype.type]
    if batch.args[1].dtype == FP8:
        tol = 3e-2
    np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32), atol=tol, rtol=tol)


# Decodes and prefill chunks: contexts at, below and past the window; a 17-token chunk whose
# queries start before the window edge and end well past it (chunked prefill across the boundary).
CONTEXTS, QUERIES = [1, 9, 40, 61], [1, 1, 17, 9]


@pytest.mark.parametrize("window", [BLOCK - 1, BLOCK, BLOCK + 1])
def test_window_edges_match_reference(window):
    batch = poison_before_window(make_batch(CONTEXTS, QUERIES, block_size=BLOCK, group=2, seed=window), window)
    _check(batch, window, pages_per_compute_block=2, num_splits=2, queries_per_block=8)


def test_gqa_wide_group_and_unaligned_start():
    """Group of 4 query heads per KV head; one page per compute block so programs start on any page."""
    window = 20
    batch = poison_before_window(make_batch(CONTEXTS, QUERIES, block_size=BLOCK, group=4, seed=7), window)
    _check(batch, window, pages_per_compute_block=1, num_splits=1, queries_per_block=4)


def test_fp8_pool_with_window():
    window = BLOCK + 1
    batch = poison_before_window(
        make_batch(CONTEXTS, QUERIES, block_size=BLOCK, group=2, pool_dtype=FP8, seed=3), window)
    _check(batch, window, pages_per_compute_block=2, num_splits=2, queries_per_block=8)


def test_window_wider_than_every_context_is_full_attention():
    batch = make_batch([5, 30], [2, 7], block_size=BLOCK, group=2, seed=1)
    full = _run(ragged_paged_attention, batch, None, pages_per_compute_block=2, num_splits=2, queries_per_block=8)
    wide = _run(ragged_paged_attention, batch, 64, pages_per_compute_block=2, num_splits=2, queries_per_block=8)
    np.testing.assert_allclose(np.asarray(wide), np.asarray(full), atol=1e-6, rtol=1e-6)
