"""The Mosaic GPU ragged paged-attention kernel against its pure-JAX reference.

On CPU every case runs in Mosaic GPU interpret mode (JAX 0.11.2 and 0.12) with the race
detector on: shared memory, barriers and TMA copies are simulated, uninitialised
shared memory reads as NaN, and a race raises. `JAXPAGED_PALLAS_INTERPRET=0` runs the
same cases compiled on a Hopper GPU (`scripts/gpu_check.sh`); `JAXPAGED_MGPU_FULL_GRID=1`
adds the whole block-size x head-dim x group grid. Every pool is NaN outside the
sequences' contexts, with blocks in random physical order.
"""

from __future__ import annotations

import functools
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import ragged_paged_attention_mgpu as mgpu
from pallas_kernels.reference import ragged_paged_attention_reference
from pallas_kernels.tuning_mgpu import choose_mosaic_launch_params
from tests.kernels.paged_batches import FP8, make_batch

INTERPRET = os.environ.get("JAXPAGED_PALLAS_INTERPRET", "1") != "0"
FULL_GRID = os.environ.get("JAXPAGED_MGPU_FULL_GRID", "0") == "1"
TOLERANCE = 3e-2  # bf16 queries and output
COMPILER_OPTIONS = {"xla_backend_optimization_level": 0} if INTERPRET else None

if INTERPRET and not hasattr(mgpu.plgpu, "InterpretGPUParams"):
    pytest.skip("this JAX has no Mosaic GPU interpret mode", allow_module_level=True)


@functools.cache
def jitted(fn, **static):
    """One compiled function per (function, static arguments), shared across tests."""
    return jax.jit(functools.partial(fn, **static), compiler_options=COMPILER_OPTIONS)


def run_kernel(batch, sliding_window=None, **launch):
    interpret = mgpu.interpret_params(detect_races=True) if INTERPRET else None
    fn = jitted(mgpu.ragged_paged_attention_mgpu, interpret=interpret, max_query_len=batch.max_query_len,
                sm_scale=0.125, sliding_window=sliding_window, **launch)
    return fn(*batch.args, k_scale=batch.k_scale, v_scale=batch.v_scale)


def run_reference(batch, sliding_window=None):
    fn = jitted(ragged_paged_attention_reference, max_query_len=batch.max_query_len, sm_scale=0.125,
                sliding_window=sliding_window)
    return fn(*batch.args, k_scale=batch.k_scale, v_scale=batch.v_scale)


def assert_matches_reference(batch, sliding_window=None, **launch) -> jax.Array:
    """Kernel output equals the reference within bf16 tolerance; no NaN; padding rows zero."""
    expected = run_reference(batch, sliding_window)
    actual = run_kernel(batch, sliding_window, **launch)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert not jnp.isnan(actual).any()
    np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32),
                               atol=TOLERANCE, rtol=TOLERANCE)
    real_rows = int(np.asarray(batch.args[-1]).sum())
    assert not actual[real_rows:].any(), "padding rows must be zero"
    return actual


def mixed_batch(block_size, head_dim, group, *, pool_dtype=jnp.bfloat16, seed=0):
    """Decode and chunked-prefill rows in one launch, contexts at block and step edges +-1.

    Rows: decodes at 1, 63, 64, 65 and 129 keys (one 64/128-key pipeline step and
    its edges), an empty (padding) sequence, a one-token prefill chunk, a chunk
    starting mid-block after a cached prefix, a whole prompt ending on a block edge;
    3 padding rows at the end.
    """
    contexts = [1, 63, 64, 65, 129, 0, 40, 3 * block_size + 7, 2 * block_size]
    query_lens = [1, 1, 1, 1, 1, 0, 1, block_size + 2, 2 * block_size]
    return make_batch(contexts, query_lens, block_size=block_size, group=group, head_dim=head_dim,
                      dtype=jnp.bfloat16, pool_dtype=pool_dtype, num_tokens=sum(query_lens) + 3,
                      max_query_len=2 * block_size, seed=seed)


# --- the grid: block size x head dim x GQA group ---------------------------------------

# Every block size, head dim and group at least once; the full product behind FULL_GRID.
DEFAULT_GRID = [(16, 64, 1), (32, 64, 8), (64, 128, 4)]
GRID = list(itertools.product([16, 32, 64], [64, 128], [1, 4, 8])) if FULL_GRID else DEFAULT_GRID


@pytest.mark.parametrize("block_size,head_dim,group", GRID)
def test_mixed_step_matches_reference(block_size, head_dim, group):
    assert_matches_reference(mixed_batch(block_size, head_dim, group))


@pytest.mark.parametrize("block_size,group", [(16, 8), (64, 1)])
def test_decode_batch_matches_reference(block_size, group):
    """A pure decode launch (128-key steps) at step edges +-1, with padding sequences."""
    contexts = [1, 127, 128, 129, 255, 0]
    batch = make_batch(contexts, [1, 1, 1, 1, 1, 0], block_size=block_size, group=group, head_dim=64,
                       dtype=jnp.bfloat16, num_tokens=8, seed=1)
    assert_matches_reference(batch)


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
def test_fp8_pool_matches_reference(decode):
    query_lens = [1, 1, 1, 0] if decode else [17, 1, 32, 0]
    batch = make_batch([150, 16, 33, 0], query_lens, block_size=16, group=4, head_dim=64,
                       dtype=jnp.bfloat16, pool_dtype=FP8, seed=2, max_query_len=1 if decode else 32)
    assert_matches_reference(batch, num_splits=2)


@pytest.mark.parametrize("launch", [dict(num_splits=3), dict(num_splits=2, pages_per_step=4, num_stages=3)])
def test_split_kv_matches_reference(launch):
    """Flash-decoding: uneven splits, splits with no visible block, and their merge."""
    batch = make_batch([300, 1, 64, 129, 0], [1, 1, 1, 20, 0], block_size=16, group=4, head_dim=64,
                       dtype=jnp.bfloat16, max_query_len=32, seed=3)
    assert_matches_reference(batch, **launch)


def poison_outside_window(batch, window: int, block_size: int):
    """NaN every block wholly before every query's window: such blocks may be freed."""
    q, k_pages, v_pages, tables, context_lens, query_start, query_lens = batch.args
    k, v = np.asarray(k_pages, np.float32), np.asarray(v_pages, np.float32)
    for s, (ctx, qlen) in enumerate(zip(np.asarray(context_lens), np.asarray(query_lens))):
        first_key = max(int(ctx) - int(qlen) - window + 1, 0)
        for j in range(first_key // block_size):
            k[:, tables[s, j]] = v[:, tables[s, j]] = np.nan
    batch.args = (q, jnp.asarray(k, k_pages.dtype), jnp.asarray(v, v_pages.dtype), *batch.args[3:])
    return batch


@pytest.mark.parametrize("window,launch", [(50, {}), (70, dict(num_splits=2))])
def test_sliding_window_skips_freed_blocks(window, launch):
    batch = make_batch([300, 100, 45, 0], [1, 20, 45, 0], block_size=16, group=4, head_dim=64,
                       dtype=jnp.bfloat16, max_query_len=64, seed=4)
    assert_matches_reference(poison_outside_window(batch, window, 16), sliding_window=window, **launch)


# --- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "change,field",
    [
        (dict(dtype=jnp.float32), "q dtype"),
        (dict(head_dim=32), "head_dim"),
        (dict(head_dim=256), "head_dim"),
        (dict(group=128), "query heads per KV head"),
    ],
)
def test_rejects_unsupported_inputs(change, field):
    kwargs = dict(block_size=16, group=4, head_dim=64, dtype=jnp.bfloat16) | change
    batch = make_batch([20], [1], **kwargs)
    with pytest.raises(ValueError, match=field):
        batch.run(mgpu.ragged_paged_attention_mgpu)


def test_rejects_bad_window_and_step():
    batch = make_batch([20], [1], block_size=16, group=4, head_dim=64, dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="sliding_window"):
        batch.run(mgpu.ragged_paged_attention_mgpu, sliding_window=0)
    with pytest.raises(ValueError, match="pages_per_step"):
        batch.run(mgpu.ragged_paged_attention_mgpu, pages_per_step=3)


# --- launch heuristic ------------------------------------------------------------------

heuristic = functools.partial(choose_mosaic_launch_params, num_kv_heads=8, block_size=16, head_dim=128,
                              kv_itemsize=2, compute_itemsize=2)


@pytest.mark.parametrize("group", [1, 4, 8])
def test_heuristic_fills_one_warpgroup_tile(group):
    params = heuristic(num_seqs=64, group=group, max_query_len=1, blocks_per_seq=512)
    assert params.queries_per_block * group == 64
    assert params.pages_per_step * 16 == 128


def test_heuristic_stages_fit_shared_memory():
    """Q + out + P + stages x (K + V) stays inside the budget, for bf16 and fp8 pools."""
    for kv_itemsize, decode in itertools.product([2, 1], [True, False]):
        p = heuristic(num_seqs=4, group=4, max_query_len=1 if decode else 512, blocks_per_seq=64,
                      kv_itemsize=kv_itemsize)
        keys = p.pages_per_step * 16
        used = 64 * 128 * (2 + 4) + 64 * keys * 2 + p.num_stages * 2 * keys * 128 * kv_itemsize
        used += 2 * keys * 128 * 2 if kv_itemsize == 1 else 0
        assert 2 <= p.num_stages <= 4 and used <= 200 * 1024


@pytest.mark.parametrize(
    "num_seqs,max_query_len,blocks_per_seq,splits",
    [(1, 1, 4, 1), (1, 1, 2048, 64), (256, 1, 2048, 1), (1, 512, 2048, 4)],
)
def test_heuristic_splits_long_contexts_of_few_tiles(num_seqs, max_query_len, blocks_per_seq, splits):
    """Splits fill 4 x 132 CTAs, counting this kernel's 64-row query tiles.

    512 queries x 8 KV heads at group 4 are 256 CTAs: 4 splits.
    """
    params = heuristic(num_seqs=num_seqs, group=4, max_query_len=max_query_len, blocks_per_seq=blocks_per_seq)
    assert params.num_splits == splits


# --- Mosaic GPU lowering for sm_90, without a GPU ------------------------------------------


@pytest.mark.parametrize("pool_dtype", [jnp.bfloat16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("sliding_window", [None, 64])
def test_lowers_to_mosaic_gpu_for_hopper(pool_dtype, sliding_window):
    """Lower the compiled kernel through Pallas' Mosaic GPU pipeline on this CPU machine.

    With no GPU the lowering targets sm_90 (Hopper); it checks layouts, WGMMA operand
    shapes and swizzles, TMA slices and dtype conversions. PTX assembly and running
    it need a device.
    """
    batch = make_batch([250, 40, 0], [1, 30, 0], block_size=16, group=4, head_dim=128, dtype=jnp.bfloat16,
                       pool_dtype=pool_dtype, max_query_len=32)
    fn = jax.jit(functools.partial(mgpu.ragged_paged_attention_mgpu, max_query_len=32, sm_scale=0.1,
                                   k_scale=batch.k_scale, v_scale=batch.v_scale, num_splits=2,
                                   sliding_window=sliding_window))
    hlo = fn.trace(*batch.args).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in hlo
