"""The CPU attention kernel (C++ over the XLA FFI, the `cpu` backend: decode rows and prefill chunks) against the gather reference.

Pools are NaN outside the sequences' contexts (tests/kernels/paged_batches.py), so a
slot read that a sequence does not own shows up as NaN in the output.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.attention import cpu_attention
from pallas_kernels.reference import ragged_paged_attention_reference
from tests.kernels.paged_batches import FP8, boundary_contexts, make_batch

TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2}


@functools.cache
def jitted(fn, **static):
    """One compiled function per (function, static arguments)."""
    return jax.jit(functools.partial(fn, **static))


def assert_matches_reference(batch, **static) -> None:
    """The kernel's output equals the reference's within the query dtype's tolerance, with no NaN."""
    expected = batch.run(lambda *a, **k: jitted(ragged_paged_attention_reference, **static,
                                                max_query_len=k.pop("max_query_len"),
                                                sm_scale=k.pop("sm_scale"))(*a, **k))
    actual = batch.run(lambda *a, **k: jitted(cpu_attention.cpu_paged_attention, **static,
                                              max_query_len=k.pop("max_query_len"),
                                              sm_scale=k.pop("sm_scale"))(*a, **k))
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert not jnp.isnan(actual).any()
    tol = TOLERANCE[batch.args[0].dtype.type]
    np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32), atol=tol, rtol=tol)


def test_the_kernel_builds_here():
    """The suite's machines have a C++ compiler: the kernel must build, or every `cpu` test below means nothing."""
    assert cpu_attention.available()


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("block_size", [4, 16])
def test_decode_rows_across_block_edges(group, block_size):
    contexts = boundary_contexts(block_size)
    batch = make_batch(contexts, [1] * len(contexts), block_size=block_size, group=group, seed=group)
    assert_matches_reference(batch)


@pytest.mark.parametrize("dtype, pool_dtype", [(jnp.bfloat16, jnp.bfloat16), (jnp.float32, FP8),
                                               (jnp.bfloat16, FP8)])
def test_bf16_and_fp8_pools(dtype, pool_dtype):
    contexts = [1, 7, 8, 9, 31, 40]
    batch = make_batch(contexts, [1] * len(contexts), block_size=8, group=2, dtype=dtype, pool_dtype=pool_dtype)
    assert_matches_reference(batch)


@pytest.mark.parametrize("window", [1, 13])
def test_sliding_window_and_soft_cap(window):
    contexts = [1, 4, 8, 9, 20, 33]
    batch = make_batch(contexts, [1] * len(contexts), block_size=8, group=2, seed=window)
    assert_matches_reference(batch, sliding_window=window)
    assert_matches_reference(batch, sliding_window=window, soft_cap=2.0)


def test_padding_sequences_and_rows_are_zero():
    """Padding sequences (no query row) and padding rows past the last sequence come out as zeros."""
    batch = make_batch([5, 0, 17, 0], [1, 0, 1, 0], block_size=4, group=2, num_tokens=4, blocks_per_seq=8)
    assert_matches_reference(batch)
    out = batch.run(lambda *a, **k: jitted(cpu_attention.cpu_paged_attention, max_query_len=1,
                                           sm_scale=k.pop("sm_scale"))(*a, **{x: k[x] for x in ("k_scale", "v_scale")}))
    assert not np.asarray(out[2:]).any()


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("block_size", [4, 16])
def test_prefill_chunks_beside_decode_rows(group, block_size):
    """Chunks longer than a query tile, starting mid-block or at 0, beside decode rows and padding."""
    contexts = [block_size + 3, 40, 37, 1, 0, 2 * block_size]
    queries = [block_size + 3, 21, 1, 1, 0, 17]
    batch = make_batch(contexts, queries, block_size=block_size, group=group, seed=block_size + group,
                       num_tokens=sum(queries) + 3, blocks_per_seq=12)
    assert_matches_reference(batch)


@pytest.mark.parametrize("dtype, pool_dtype", [(jnp.bfloat16, jnp.bfloat16), (jnp.float32, FP8)])
def test_prefill_chunks_in_bf16_and_fp8_pools(dtype, pool_dtype):
    contexts, queries = [30, 9, 40], [30, 2, 19]
    batch = make_batch(contexts, queries, block_size=8, group=2, dtype=dtype, pool_dtype=pool_dtype, seed=7)
    assert_matches_reference(batch)


@pytest.mark.parametrize("window", [1, 13])
def test_prefill_chunks_with_sliding_window_and_soft_cap(window):
    contexts, queries = [35, 20, 9], [35, 11, 1]
    batch = make_batch(contexts, queries, block_size=8, group=2, seed=window)
    assert_matches_reference(batch, sliding_window=window)
    assert_matches_reference(batch, sliding_window=window, soft_cap=2.0)
