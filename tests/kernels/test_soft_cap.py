"""Attention logit soft-capping (Gemma 2's `attn_logit_softcapping`) in every attention kernel.

The reference against plain numpy (scores `c * tanh(s / c)` before the mask and
softmax), then the chunked XLA path, the Pallas Triton kernel and the Mosaic GPU
kernel (interpret mode on CPU) against the reference, each with a sliding window
too, over NaN-poisoned pools. The cap is small enough that it changes the output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.chunked_xla import chunked_paged_attention
from pallas_kernels.ragged_paged_attention import ragged_paged_attention
from pallas_kernels.reference import ragged_paged_attention_reference
from tests.kernels.paged_batches import make_batch
from tests.kernels.test_ragged_paged_attention import INTERPRET
from tests.kernels.test_ragged_paged_attention_window import _jitted
from tests.kernels.test_reference_window import BLOCK, numpy_windowed_attention, poison_before_window

CAP = 1.5
CONTEXTS, QUERIES = [1, 9, 40, 61], [1, 1, 17, 9]  # decodes and a prefill chunk across the window start


def _batch(window, seed=0, **kwargs):
    batch = make_batch(CONTEXTS, QUERIES, block_size=BLOCK, group=2, seed=seed, **kwargs)
    return batch if window is None else poison_before_window(batch, window)


def _reference(batch, window, soft_cap=CAP):
    fn = _jitted(ragged_paged_attention_reference, max_query_len=batch.max_query_len,
                 sm_scale=batch.args[0].shape[-1] ** -0.5, sliding_window=window, soft_cap=soft_cap)
    return np.asarray(fn(*batch.args, k_scale=batch.k_scale, v_scale=batch.v_scale), np.float32)


@pytest.mark.parametrize("window", [None, BLOCK + 1])
def test_reference_matches_numpy_and_the_cap_matters(window):
    batch = _batch(window, seed=1)
    actual = _reference(batch, window)
    expected = numpy_windowed_attention(*batch.args, window, soft_cap=CAP)
    np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=2e-5)
    assert np.abs(actual - _reference(batch, window, soft_cap=None)).max() > 1e-2


def test_chunked_xla_matches_reference():
    window = BLOCK + 1
    batch = _batch(window, seed=2)
    expected = _reference(batch, window)
    for chunking in ({"kv_chunk": BLOCK, "query_tile": 4}, {}):
        actual = batch.run(chunked_paged_attention, sliding_window=window, soft_cap=CAP, **chunking)
        np.testing.assert_allclose(np.asarray(actual), expected, atol=2e-5, rtol=2e-5)


def test_pallas_triton_matches_reference():
    window = BLOCK + 1
    batch = _batch(window, seed=3)
    fn = _jitted(ragged_paged_attention, max_query_len=batch.max_query_len, sm_scale=batch.args[0].shape[-1] ** -0.5,
                 sliding_window=window, soft_cap=CAP, interpret=INTERPRET, pages_per_compute_block=2,
                 num_splits=2, queries_per_block=8)
    actual = np.asarray(fn(*batch.args, k_scale=batch.k_scale, v_scale=batch.v_scale))
    assert not np.isnan(actual).any()
    np.testing.assert_allclose(actual, _reference(batch, window), atol=2e-5, rtol=2e-5)


def test_mosaic_gpu_matches_reference():
    from pallas_kernels import ragged_paged_attention_mgpu as mgpu

    if INTERPRET and not hasattr(mgpu.plgpu, "InterpretGPUParams"):
        pytest.skip("this JAX has no Mosaic GPU interpret mode")
    from tests.kernels.test_ragged_paged_attention_mgpu import COMPILER_OPTIONS, TOLERANCE

    # bf16, a decode and a 9-query prefill chunk starting mid-block, 2 padding rows
    batch = make_batch([1, 40], [1, 9], block_size=16, group=4, head_dim=64, dtype=jnp.bfloat16,
                       pool_dtype=jnp.bfloat16, num_tokens=12, max_query_len=16, seed=4)
    static = dict(max_query_len=batch.max_query_len, sm_scale=0.125, soft_cap=CAP)
    interpret = mgpu.interpret_params(detect_races=True) if INTERPRET else None
    kernel = jax.jit(lambda *a, **k: mgpu.ragged_paged_attention_mgpu(*a, interpret=interpret, **static, **k),
                     compiler_options=COMPILER_OPTIONS)
    reference = jax.jit(lambda *a, **k: ragged_paged_attention_reference(*a, **static, **k))
    actual = kernel(*batch.args, k_scale=batch.k_scale, v_scale=batch.v_scale)
    expected = reference(*batch.args, k_scale=batch.k_scale, v_scale=batch.v_scale)
    assert not jnp.isnan(actual).any()
    np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32),
                               atol=TOLERANCE, rtol=TOLERANCE)


def test_bad_cap_is_a_value_error():
    batch = _batch(None)
    with pytest.raises(ValueError, match="soft_cap"):
        ragged_paged_attention(*batch.args, max_query_len=batch.max_query_len, sm_scale=0.25, soft_cap=0.0,
                               interpret=True)
