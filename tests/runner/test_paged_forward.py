"""The paged forward equals a dense no-cache forward (issue 2 acceptance)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.attention import AttentionBackend
from jaxpaged.model import init_model
from jaxpaged.runner import ModelRunner
from jaxpaged.runner.step_input import ScheduledSeq, build_step_input
from tests.paged_driver import dense_check, dense_logits, drive



def _prompts(rng, lengths, vocab):
    return [list(rng.integers(0, vocab, n)) for n in lengths]


@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
def test_paged_equals_dense_across_block_sizes(tiny_model, tiny_config, block_size):
    rng = np.random.default_rng(block_size)
    runner = ModelRunner(tiny_model, num_blocks=1024 // block_size, block_size=block_size)
    prompts = _prompts(rng, [5, 17, 33, 40], tiny_config.vocab_size)
    # chunk 7 splits blocks of every size > 1; staggered joins mix prefill chunks with decodes
    seqs = drive(runner, prompts, max_new=6, chunk=7, rng=rng)
    dense_check(tiny_model, seqs)


def test_prefill_in_one_chunk_and_batched_decodes(tiny_model, tiny_config):
    rng = np.random.default_rng(7)
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=16)
    prompts = _prompts(rng, [1, 16, 31, 64, 3], tiny_config.vocab_size)
    seqs = drive(runner, prompts, max_new=5, chunk=256, rng=rng, stagger=False)
    dense_check(tiny_model, seqs)


def test_nan_pool_outside_owned_slots_gives_identical_results(tiny_model, tiny_config):
    prompts = _prompts(np.random.default_rng(3), [9, 23, 14], tiny_config.vocab_size)
    results = []
    for fill in (0.0, float("nan")):
        runner = ModelRunner(tiny_model, num_blocks=48, block_size=4, pool_fill_value=fill)
        results.append(drive(runner, prompts, max_new=5, chunk=5, rng=np.random.default_rng(11)))
    clean, poisoned = results
    for a, b in zip(clean, poisoned):
        assert a.tokens == b.tokens
        for pos in a.logits:
            assert np.all(np.isfinite(b.logits[pos]))
            np.testing.assert_allclose(a.logits[pos], b.logits[pos], atol=1e-6)
    dense_check(tiny_model, poisoned)


@pytest.mark.parametrize("block_size", [4, 8])
def test_chunked_xla_attention_over_chunk_edges_equals_dense(tiny_model, tiny_config, block_size):
    """The CPU attention with chunks of two blocks and 4-row query tiles, over a NaN-poisoned pool.

    Prompts of 16/17/33/40 tokens put context lengths on, under and over chunk
    edges; prefill chunks of 7 start mid-block; staggered joins mix decodes in.
    """
    rng = np.random.default_rng(20 + block_size)
    backend = AttentionBackend("xla", kv_chunk=2 * block_size, query_tile=4)
    runner = ModelRunner(tiny_model, num_blocks=256 // block_size, block_size=block_size, backend=backend,
                         pool_fill_value=float("nan"))
    seqs = drive(runner, _prompts(rng, [16, 17, 33, 40], tiny_config.vocab_size), max_new=5, chunk=7, rng=rng)
    dense_check(tiny_model, seqs)


@pytest.mark.parametrize("num_kv_heads", [8, 4, 2, 1])
def test_gqa_ratios(tiny_config, num_kv_heads):
    config = tiny_config.replace(num_heads=8, num_kv_heads=num_kv_heads, head_dim=8)
    model = init_model(config, seed=1)
    rng = np.random.default_rng(num_kv_heads)
    runner = ModelRunner(model, num_blocks=32, block_size=8)
    seqs = drive(runner, _prompts(rng, [12, 19], config.vocab_size), max_new=4, chunk=6, rng=rng)
    dense_check(model, seqs)


def test_pool_is_donated_not_copied(tiny_model):
    runner = ModelRunner(tiny_model, num_blocks=8, block_size=4)
    before = runner.pool
    runner.execute(build_step_input([ScheduledSeq([1, 2, 3], 0, [2])], 4))
    assert all(a.is_deleted() for a in before.k + before.v)
    assert not any(a.is_deleted() for a in runner.pool.k + runner.pool.v)


@pytest.mark.parametrize("num_decodes", [1, 2])
def test_decode_steps_update_the_pool_in_place(tiny_model, tiny_config, num_decodes):
    # A one-token step once compiled to a copy of every layer's whole pool (a one-index scatter became
    # a dynamic-update-slice): a single-sequence decode cost O(pool size).
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=4)
    step = build_step_input([ScheduledSeq([7], 5 + i, [2 * i, 2 * i + 1]) for i in range(num_decodes)], 4)
    hlo = runner.lower(step).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):]
    pool_shape = f"[{tiny_config.num_kv_heads},64,4,{tiny_config.head_dim}]"
    assert pool_shape in entry
    copies = [line for line in entry.splitlines() if " copy(" in line and pool_shape in line.split("=")[1][:40]]
    assert copies == []


def test_compile_count_bounded_over_varied_steps(tiny_model, tiny_config):
    rng = np.random.default_rng(5)
    block_size, num_blocks = 8, 128
    runner = ModelRunner(tiny_model, num_blocks=num_blocks, block_size=block_size)
    steps, layouts = [], set()
    for _ in range(50):
        seqs = []
        for _ in range(int(rng.integers(1, 9))):  # decodes at varied context lengths
            computed = int(rng.integers(0, 60))
            seqs.append(ScheduledSeq([int(rng.integers(0, 200))], computed,
                                     list(rng.choice(num_blocks, computed // block_size + 1, replace=False))))
        if rng.random() < 0.5:  # plus, sometimes, a prefill chunk
            computed, q = int(rng.integers(0, 40)), int(rng.integers(2, 17))
            seqs.append(ScheduledSeq(list(rng.integers(0, 200, q)), computed,
                                     list(rng.choice(num_blocks, -(-(computed + q) // block_size), replace=False))))
        step = build_step_input(seqs, block_size)
        steps.append(step)
        layouts.add((step.token_ids.shape, step.block_tables.shape, step.layout))
    for step in steps:
        runner.execute(step)
    first_pass = runner.num_compiles
    for step in steps:
        runner.execute(step)
    # one compile per distinct bucketed shape, none on a repeat, and the buckets keep the set small
    assert first_pass == len(layouts)
    assert runner.num_compiles == first_pass
    assert first_pass <= 16


def test_copy_blocks_copies_whole_blocks_and_drops_padding(tiny_model):
    runner = ModelRunner(tiny_model, num_blocks=6, block_size=4)
    rng = np.random.default_rng(0)
    runner.write_blocks(range(6), [rng.standard_normal(runner.kv_block_shape) for _ in range(6)])
    before = runner.read_blocks(range(6))
    runner.copy_blocks([(1, 4), (2, 0), (5, 3)])  # three pairs: padded to four, the pad dropped
    after = runner.read_blocks(range(6))
    expected = list(before)
    expected[4], expected[0], expected[3] = before[1], before[2], before[5]
    for block, (new, old) in enumerate(zip(after, expected)):
        np.testing.assert_array_equal(new, old, err_msg=f"block {block}")


def test_logits_match_with_pallas_interpret_available():
    """Placeholder guard: the backend resolver rejects pallas without GPU unless interpreted."""
    from jaxpaged.attention import resolve_backend
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="needs a GPU"):
            resolve_backend("pallas")
    assert resolve_backend("pallas", interpret=True) == AttentionBackend("pallas", True)
    expected_auto = "cpu" if jax.default_backend() == "cpu" else ("pallas", "pallas_mosaic")
    assert resolve_backend("auto").name in expected_auto  # cpu: the suite's machines build its kernel


def test_sliding_window_layers_paged_equal_dense_past_the_window(tiny_config):
    """Interleaved sliding (W=12) and full layers, prompts past the window, NaN pool, chunked prefill.

    The driver keeps every block, so this checks the per-layer window masks alone; with
    the window ignored the sliding layers would see up to 40 keys and differ from dense.
    """
    layer_types = tuple("full_attention" if i % 2 else "sliding_attention" for i in range(tiny_config.num_layers))
    config = tiny_config.replace(sliding_window=12, layer_types=layer_types)
    model = init_model(config, seed=2)
    rng = np.random.default_rng(12)
    backend = AttentionBackend("xla", kv_chunk=8, query_tile=4)
    runner = ModelRunner(model, num_blocks=64, block_size=4, backend=backend, pool_fill_value=float("nan"))
    seqs = drive(runner, _prompts(rng, [11, 13, 40], config.vocab_size), max_new=5, chunk=7, rng=rng)
    dense_check(model, seqs)
    full = init_model(tiny_config, seed=2)
    assert not np.allclose(dense_logits(full, seqs[2].tokens), dense_logits(model, seqs[2].tokens), atol=1e-3)
