"""The Pallas ragged paged-attention kernel against its pure-JAX reference.

Runs in Pallas interpret mode on CPU by default; `JAXPAGED_PALLAS_INTERPRET=0` runs the
same cases compiled on a GPU (`scripts/gpu_check.sh`). Every pool is NaN outside the
sequences' contexts, with blocks in random physical order, so a kernel that reads a
slot it does not own fails with NaN.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.ragged_paged_attention import merge_splits, ragged_paged_attention
from tests.kernels.paged_batches import FP8, HEAD_DIM, Batch, boundary_contexts, make_batch
from pallas_kernels.reference import ragged_paged_attention_reference
from pallas_kernels.tuning import choose_launch_params

INTERPRET = os.environ.get("JAXPAGED_PALLAS_INTERPRET", "1") != "0"
TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}

# Interpret mode lowers the kernel to a large HLO loop; at these sizes compiling it
# costs far more than running it, so skip XLA's backend optimisations (2-3x faster).
COMPILER_OPTIONS = {"xla_backend_optimization_level": 0} if INTERPRET else None


@functools.cache
def jitted(fn, **static):
    """One compiled function per (function, static arguments), shared across tests."""
    return jax.jit(functools.partial(fn, **static), compiler_options=COMPILER_OPTIONS)


def reference(*args, **kwargs):
    return jitted(ragged_paged_attention_reference, max_query_len=kwargs.pop("max_query_len"),
                  sm_scale=kwargs.pop("sm_scale"))(*args, **kwargs)


def kernel(*args, k_scale=None, v_scale=None, **static):
    return jitted(ragged_paged_attention, interpret=INTERPRET, **static)(*args, k_scale=k_scale, v_scale=v_scale)


def assert_matches_reference(batch: Batch, **launch) -> jax.Array:
    """Kernel output equals the reference within the query dtype's tolerance; no NaN."""
    expected = batch.run(reference)
    actual = batch.run(kernel, **launch)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert not jnp.isnan(actual).any()
    tol = TOLERANCE[batch.args[0].dtype.type]
    np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32), atol=tol, rtol=tol)
    return actual


# --- decode: one query per sequence --------------------------------------------------


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_decode_matches_reference(block_size, group):
    contexts = boundary_contexts(block_size) + [0]  # the last sequence is padding
    batch = make_batch(contexts, [1] * (len(contexts) - 1) + [0], block_size=block_size, group=group,
                       num_tokens=len(contexts) + 1)
    out = assert_matches_reference(batch)
    assert not out[len(contexts) - 1:].any(), "padding rows must be zero"


@pytest.mark.parametrize("num_splits", [2, 4, 8])
def test_decode_split_k(num_splits):
    batch = make_batch([300, 1, 64, 129, 0], [1, 1, 1, 1, 0], block_size=16, group=4)
    assert_matches_reference(batch, num_splits=num_splits)


# --- prefill: ragged chunks over a cached prefix --------------------------------------


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_prefill_matches_reference(block_size, group):
    # Whole prompts, chunks after a cached prefix, a chunk ending on a block boundary,
    # a one-token chunk and a padding sequence; 3 padding rows at the end.
    query_lens = [13, 1, 2 * block_size, 5, 0, 20]
    contexts = [13, 200, 4 * block_size, block_size + 5, 0, 20]
    batch = make_batch(contexts, query_lens, block_size=block_size, group=group,
                       num_tokens=sum(query_lens) + 3, max_query_len=64)
    out = assert_matches_reference(batch)
    assert not out[sum(query_lens):].any()


@pytest.mark.parametrize(
    "launch",
    [
        dict(num_splits=2),
        dict(num_splits=4, pages_per_compute_block=2),
        dict(queries_per_block=4, pages_per_compute_block=1),
        dict(queries_per_block=8, num_splits=3),
    ],
)
def test_prefill_launch_overrides(launch):
    batch = make_batch([40, 200, 9], [40, 17, 9], block_size=16, group=4, max_query_len=64, seed=1)
    assert_matches_reference(batch, **launch)


# --- dtypes ---------------------------------------------------------------------------


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
@pytest.mark.parametrize(
    "dtype,pool_dtype",
    [(jnp.bfloat16, jnp.bfloat16), (jnp.bfloat16, FP8), (jnp.float32, FP8)],
    ids=["bf16", "fp8-bf16q", "fp8-f32q"],
)
def test_dtypes(dtype, pool_dtype, decode):
    query_lens = [1, 1, 1, 0] if decode else [17, 1, 32, 0]
    batch = make_batch([150, 16, 33, 0], query_lens, block_size=16, group=4, dtype=dtype,
                       pool_dtype=pool_dtype, seed=2)
    assert_matches_reference(batch, num_splits=2)


# --- properties -----------------------------------------------------------------------


def test_output_independent_of_physical_layout_and_splits():
    """Same logical data in another block order, under another split count: same output."""
    first = make_batch([90, 31], [7, 1], block_size=8, group=4, seed=3)
    second = make_batch([90, 31], [7, 1], block_size=8, group=4, seed=3)
    q, k, v, tables, *rest = second.args
    order = np.random.default_rng(4).permutation(k.shape[1])
    inverse = np.argsort(order)
    second.args = (q, k[:, order], v[:, order], jnp.asarray(inverse)[tables], *rest)
    a = first.run(kernel, num_splits=1)
    b = second.run(kernel, num_splits=2)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=2e-5)


def test_runs_inside_jit_with_traced_lengths():
    batch = make_batch([40, 3], [1, 1], block_size=16, group=4)

    @functools.partial(jax.jit, compiler_options=COMPILER_OPTIONS)
    def step(*args):
        return ragged_paged_attention(*args, max_query_len=1, sm_scale=HEAD_DIM**-0.5, interpret=INTERPRET)

    np.testing.assert_allclose(np.asarray(step(*batch.args)), np.asarray(batch.run(reference)), atol=2e-5)


def test_merge_splits_matches_single_softmax():
    rng = np.random.default_rng(5)
    scores = rng.standard_normal((3, 20)) * 10
    values = rng.standard_normal((20, 4))
    parts = np.array_split(np.arange(20), 4)
    outs, maxes, sums = [], [], []
    for idx in parts:
        m = scores[:, idx].max(axis=1)
        p = np.exp(scores[:, idx] - m[:, None])
        outs.append(p @ values[idx] / p.sum(axis=1, keepdims=True))
        maxes.append(m)
        sums.append(p.sum(axis=1))
    merged = merge_splits(*(jnp.asarray(np.stack(x), jnp.float32) for x in (outs, maxes, sums)))
    expected = jax.nn.softmax(scores, axis=1) @ values
    np.testing.assert_allclose(np.asarray(merged), expected, atol=1e-5)


# --- launch heuristic -----------------------------------------------------------------

heuristic = functools.partial(choose_launch_params, num_kv_heads=8, block_size=16)


@pytest.mark.parametrize("group", [1, 4, 8])
def test_heuristic_decode_fills_a_dot_tile(group):
    params = heuristic(num_seqs=64, group=group, max_query_len=1, blocks_per_seq=512)
    assert params.queries_per_block * group == 16
    assert params.pages_per_compute_block * 16 == 128


def test_heuristic_splits_only_long_contexts_of_small_batches():
    assert heuristic(num_seqs=1, group=4, max_query_len=1, blocks_per_seq=4).num_splits == 1
    assert heuristic(num_seqs=1, group=4, max_query_len=1, blocks_per_seq=2048).num_splits == 64
    assert heuristic(num_seqs=256, group=4, max_query_len=1, blocks_per_seq=2048).num_splits == 1


def test_heuristic_prefill_tiles_and_overrides():
    params = heuristic(num_seqs=4, group=4, max_query_len=512, blocks_per_seq=64)
    assert params.queries_per_block * 4 == 128 and params.num_warps == 8
    assert heuristic(num_seqs=4, group=4, max_query_len=512, blocks_per_seq=64, num_splits=3).num_splits == 3


# --- Triton lowering, without a GPU ---------------------------------------------------


@pytest.mark.parametrize(
    "decode,block_size,group,pool_dtype",
    [(True, 16, 4, jnp.bfloat16), (True, 8, 1, FP8), (False, 32, 8, jnp.bfloat16), (False, 16, 4, FP8)],
)
def test_lowers_to_triton_for_hopper(monkeypatch, decode, block_size, group, pool_dtype):
    """Lower the compiled kernel for CUDA sm_90 on this CPU machine (Pallas -> Triton IR).

    Catches ops the Triton lowering rejects before a GPU run; uses a private JAX hook
    for the GPU model, so it skips if that hook moves.
    """
    try:
        from jax._src.pallas.triton import gpu_info, pallas_call_registration
        hopper = gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H100)
    except (ImportError, AttributeError) as error:
        pytest.skip(f"private Triton GPU-info hook unavailable: {error}")
    monkeypatch.setattr(pallas_call_registration.gpu_info_lib, "get_gpu_info", lambda: hopper)
    query_lens = [1, 1, 0] if decode else [30, 40, 0]
    batch = make_batch([250, 40, 0], query_lens, block_size=block_size, group=group,
                       dtype=jnp.bfloat16, pool_dtype=pool_dtype)
    fn = jax.jit(functools.partial(ragged_paged_attention, max_query_len=batch.max_query_len,
                                   sm_scale=0.1, k_scale=batch.k_scale, v_scale=batch.v_scale))
    hlo = fn.trace(*batch.args).lower(lowering_platforms=("cuda",)).as_text()
    assert "__gpu$xla.gpu.triton" in hlo
