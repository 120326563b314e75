"""The chunked XLA attention (the CPU `xla` backend) against the gather reference.

Every pool is NaN outside the sequences' contexts (blocks in random physical
order, padded block-table entries pointing at poisoned blocks), so reading a
slot a sequence does not own shows up as NaN. Small `kv_chunk` / `query_tile`
values put chunk and tile edges inside the contexts: lengths of exactly k
chunks, one under and one over, prefill chunks starting mid-block.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.attention import AttentionBackend, AttentionBatch, StepLayout, paged_attention
from pallas_kernels.chunked_xla import CHUNK_BUDGET_BYTES, MAX_KV_CHUNK, PREFILL_QUERY_TILE, chunked_paged_attention, choose_chunking
from pallas_kernels.reference import ragged_paged_attention_reference
from tests.kernels.paged_batches import FP8, HEAD_DIM, Batch, make_batch

TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}


@functools.cache
def jitted(fn, **static):
    """One compiled function per (function, static arguments), shared across tests."""
    return jax.jit(functools.partial(fn, **static))


def reference(*args, max_query_len, sm_scale, sliding_window=None, **scales):
    return jitted(ragged_paged_attention_reference, max_query_len=max_query_len, sm_scale=sm_scale,
                  sliding_window=sliding_window)(*args, **scales)


def chunked(*args, max_query_len, sm_scale, kv_chunk=None, query_tile=None, sliding_window=None, **scales):
    return jitted(chunked_paged_attention, max_query_len=max_query_len, sm_scale=sm_scale,
                  kv_chunk=kv_chunk, query_tile=query_tile, sliding_window=sliding_window)(*args, **scales)


def assert_matches_reference(batch: Batch, **chunking) -> jax.Array:
    """Chunked output equals the reference within the query dtype's tolerance; no NaN."""
    expected = batch.run(reference)
    actual = batch.run(chunked, **chunking)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert not jnp.isnan(actual).any()
    tol = TOLERANCE[batch.args[0].dtype.type]
    np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32), atol=tol, rtol=tol)
    return actual


def chunk_edges(chunk: int) -> list[int]:
    """Context lengths on and either side of whole-chunk boundaries."""
    return [1, chunk - 1, chunk, chunk + 1, 2 * chunk, 3 * chunk - 1, 3 * chunk + 1]


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("block_size", [4, 16])
def test_decode_matches_reference_across_chunk_edges(block_size, group):
    chunk = 2 * block_size
    contexts = chunk_edges(chunk) + [0]  # the last sequence is padding
    # The table is twice as wide as the longest context, as a bucketed step pads it.
    batch = make_batch(contexts, [1] * (len(contexts) - 1) + [0], block_size=block_size, group=group,
                       num_tokens=len(contexts) + 2, blocks_per_seq=2 * (3 * chunk + 1) // block_size + 2)
    out = assert_matches_reference(batch, kv_chunk=chunk)
    assert not out[len(contexts) - 1:].any(), "padding rows must be zero"


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("block_size", [4, 16])
def test_prefill_matches_reference_across_chunk_and_tile_edges(block_size, group):
    chunk, tile = 2 * block_size, 8
    # Whole prompts of exactly one chunk and one past it; a chunk after a cached prefix
    # that starts mid-block; chunks of one tile, one past a tile, a single row; a padding sequence.
    query_lens = [chunk, chunk + 1, 7, tile + 1, tile, 1, 0, 3 * tile]
    contexts = [chunk, chunk + 1, 3 * block_size + 5, 2 * chunk + tile + 1, tile, 3 * chunk - 1, 0, 3 * tile]
    batch = make_batch(contexts, query_lens, block_size=block_size, group=group,
                       num_tokens=sum(query_lens) + 3, max_query_len=64)
    out = assert_matches_reference(batch, kv_chunk=chunk, query_tile=tile)
    assert not out[sum(query_lens):].any(), "padding rows must be zero"


@pytest.mark.parametrize(
    "kv_chunk,query_tile",
    [(None, None), (8, 64), (24, 5), (1000, 16), (8, 1)],
    ids=["auto", "one-block-chunks", "three-block-chunks-odd-tile", "chunk-wider-than-table", "one-row-tiles"],
)
def test_chunking_does_not_change_the_output(kv_chunk, query_tile):
    batch = make_batch([90, 31, 57, 200], [23, 1, 57, 40], block_size=8, group=4, max_query_len=64, seed=3)
    assert_matches_reference(batch, kv_chunk=kv_chunk, query_tile=query_tile)


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
    assert_matches_reference(batch, kv_chunk=32, query_tile=16)


def test_mixed_decode_and_prefill_step_through_the_backend():
    """`paged_attention` with the xla backend equals it with xla_reference on a mixed step.

    Three decode rows (one of them padding) first, then two prefill chunks and a
    padding sequence, as `build_step_input` lays a step out.
    """
    query_lens = [1, 1, 0, 12, 30, 0]
    contexts = [77, 8, 0, 40, 30, 0]
    batch = make_batch(contexts, query_lens, block_size=8, group=2, num_tokens=3 + 42 + 6, seed=5)
    q, k_pages, v_pages, tables, context_lens, _, lens = batch.args
    query_start = jnp.array([0, 1, 2, 3, 15, 45], jnp.int32)  # the padding decode owns row 2
    attention = AttentionBatch(jnp.full(q.shape[0], -1, jnp.int32), tables, context_lens, query_start, lens)
    layout = StepLayout(num_decode_seqs=3, max_prefill_query_len=32)
    ones = jnp.ones(k_pages.shape[0], jnp.float32)

    def run(backend):
        fn = jax.jit(functools.partial(paged_attention, layout=layout, backend=backend))
        return fn(q, k_pages, v_pages, attention, k_scale=ones, v_scale=ones)

    expected = run(AttentionBackend("xla_reference"))
    actual = run(AttentionBackend("xla", kv_chunk=16, query_tile=8))
    assert not jnp.isnan(actual).any()
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), atol=2e-5, rtol=2e-5)
    assert not actual[2].any() and not actual[45:].any(), "padding rows must be zero"


def test_runs_inside_jit_with_traced_lengths_and_default_scale():
    batch = make_batch([40, 3], [1, 1], block_size=16, group=4)
    step = jax.jit(lambda *args: chunked_paged_attention(*args, max_query_len=1, sm_scale=HEAD_DIM**-0.5))
    np.testing.assert_allclose(np.asarray(step(*batch.args)), np.asarray(batch.run(reference)), atol=2e-5)


@pytest.mark.parametrize("num_seqs,group,max_query_len", [(64, 3, 1), (2, 3, 1), (1, 4, 4096), (8, 4, 512), (1, 1, 5)])
def test_chunking_heuristic_takes_the_largest_chunk_in_budget(num_seqs, group, max_query_len):
    num_kv_heads, head_dim, block_size = 4, 64, 16
    chunk, tile = choose_chunking(num_seqs, num_kv_heads, group, head_dim, block_size, max_query_len)
    assert tile == min(PREFILL_QUERY_TILE, max_query_len)
    assert chunk & (chunk - 1) == 0 and block_size <= chunk <= MAX_KV_CHUNK

    def working_set(keys):
        return 4 * num_seqs * num_kv_heads * keys * (2 * head_dim + tile * group)

    assert chunk == block_size or working_set(chunk) <= CHUNK_BUDGET_BYTES
    assert chunk == MAX_KV_CHUNK or working_set(2 * chunk) > CHUNK_BUDGET_BYTES


@pytest.mark.parametrize("window", [1, 7, 8, 9, 24])
def test_sliding_window_matches_reference_with_blocks_before_the_window_poisoned(window):
    """Window edges +-1 of the 8-key chunks; decodes and prefill chunks across the window start."""
    from tests.kernels.test_reference_window import BLOCK, poison_before_window

    batch = poison_before_window(
        make_batch([1, window, window + 3, 45, 60], [1, 1, 3, 9, 17], block_size=BLOCK, group=2, seed=window),
        window)
    expected = batch.run(reference, sliding_window=window)
    for chunking in ({"kv_chunk": BLOCK, "query_tile": 4}, {}):
        actual = batch.run(chunked, sliding_window=window, **chunking)
        assert not jnp.isnan(actual).any()
        np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), atol=2e-5, rtol=2e-5)
