"""Sliding-window models through the paged engine: one KVCacheManager with several KV cache groups.

Contexts well past the window (W=32, ~300-token prompts, 8-token blocks) so a
sliding group really drops blocks, in a NaN-poisoned pool: any read of a
dropped (possibly reused) or never-written block would turn outputs into NaN
or change tokens. The independent reference is the dense no-cache forward of
the same weights with the same window mask, decoded greedily.
"""

import numpy as np
import pytest

from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.model import init_model
from jaxpaged.sampling_params import SamplingParams

W, BS, NEW = 32, 8, 6


@pytest.fixture(scope="module")
def hybrid_model():
    config = load_config("tiny").replace(sliding_window=W, layer_types=("sliding_attention", "full_attention"))
    return init_model(config, seed=3)


@pytest.fixture(scope="module")
def engine(hybrid_model):
    """64 blocks: one ~300-token sequence needs 38 blocks per group without sliding (76), ~44 with it."""
    return Engine(EngineConfig(model="tiny", num_blocks=64, block_size=BS, max_num_batched_tokens=48,
                               pool_fill_value=float("nan")), model=hybrid_model)


def assert_dense_greedy(model, prompt, generated):
    """Each generated token is the argmax of the no-cache forward over everything before it (one call)."""
    tokens = list(prompt) + list(generated)
    logits = np.asarray(model.forward_dense(np.asarray([tokens[:-1]], np.int32)))[0]
    assert [int(t) for t in np.argmax(logits[len(prompt) - 1:], axis=-1)] == list(generated)


def _run(engine, prompts, params):
    first = len(engine._requests)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{first}-{i}", prompt, params)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
    return [outs[f"r{first}-{i}"] for i in range(len(prompts))]


PARAMS = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)


def test_paged_equals_dense_with_blocks_sliding_out(engine, hybrid_model):
    rng = np.random.default_rng(0)
    system = list(rng.integers(0, 250, 200))
    prompts = [system + list(rng.integers(0, 250, n)) for n in (100, 93)]
    slid_before = engine.kv.num_slid_out_blocks
    outs = _run(engine, prompts, PARAMS)
    for prompt, out in zip(prompts, outs):
        assert_dense_greedy(hybrid_model, prompt, out.outputs[0].token_ids)
    assert engine.kv.num_slid_out_blocks > slid_before
    assert max(o.metrics.peak_blocks_unshared for o in outs) < 2 * (-(-(len(prompts[0]) + NEW) // BS))
    engine.kv.check_invariants()
    assert engine.kv.stats.num_used_blocks == 0

    # the same prompts again: prefix hits (each group serving its part), the same tokens
    again = _run(engine, prompts, PARAMS)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outs]
    assert all(o.num_cached_tokens >= 200 for o in again)
    engine.kv.check_invariants()


def test_preemption_in_a_pool_too_small_for_two(engine, hybrid_model):
    """Two unrelated ~280-token sequences cannot both hold their blocks: one is preempted and recomputed."""
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(0, 250, n)) for n in (290, 270)]
    preempted_before = engine.scheduler.num_preemptions
    outs = _run(engine, prompts, PARAMS)
    for prompt, out in zip(prompts, outs):
        assert_dense_greedy(hybrid_model, prompt, out.outputs[0].token_ids)
    assert engine.scheduler.num_preemptions > preempted_before
    engine.kv.check_invariants()
    assert engine.kv.stats.num_used_blocks == 0


def test_parallel_samples_fork_and_copy_on_write_per_group(engine, hybrid_model):
    """n=2 greedy: the samples fork after the prompt (shared blocks in both groups, CoW on the last one)."""
    prompt = list(np.random.default_rng(2).integers(0, 250, 131))  # 131: the last prompt block is partial
    (out,) = _run(engine, [prompt], SamplingParams(n=2, temperature=0, max_tokens=NEW, ignore_eos=True))
    assert len(out.outputs) == 2
    for completion in out.outputs:
        assert_dense_greedy(hybrid_model, prompt, completion.token_ids)
    assert engine.kv.stats.num_cow_copies > 0
    engine.kv.check_invariants()
    assert engine.kv.stats.num_used_blocks == 0


def test_admission_counts_each_group_and_refuses_what_never_fits(engine, hybrid_model):
    """64 blocks: 400 tokens fit (50 full-group blocks + at most 11 sliding ones; all-full would need 100),
    600 never do (a ValueError naming the limit: 424 = 53 full + 11 sliding), and nothing is disturbed."""
    rng = np.random.default_rng(4)
    with pytest.raises(ValueError, match=r"max_model_len \(424\)"):  # the longest length whose groups fit 64 blocks
        engine.add_request("too-long", list(rng.integers(0, 250, 600)), PARAMS)
    assert engine.kv.stats.num_used_blocks == 0 and not engine.has_unfinished_requests()
    prompt = list(rng.integers(0, 250, 400 - NEW))
    (out,) = _run(engine, [prompt], PARAMS)
    assert_dense_greedy(hybrid_model, prompt, out.outputs[0].token_ids)
    assert out.metrics.peak_blocks_unshared <= 61


def test_prompt_logprobs_past_the_window_equal_the_dense_forward(engine, hybrid_model):
    """A request that needs its prompt's logits is admitted without a prefix lookup (the allocation path
    every model shares; the former sliding-window manager refused the call), and each position's
    logprob is the dense no-cache forward's."""
    prompt = list(np.random.default_rng(6).integers(0, 250, 90))  # ~3 windows: blocks slide out meanwhile
    _run(engine, [prompt], PARAMS)  # caches the prompt's blocks: the request below must not use them
    (out,) = _run(engine, [prompt], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1))
    assert out.num_cached_tokens == 0
    logits = np.asarray(hybrid_model.forward_dense(np.asarray([prompt], np.int32)))[0]
    peak = logits.max(-1, keepdims=True)
    ref = logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))  # log-softmax
    lp = out.prompt_logprobs
    assert lp[0] is None and len(lp) == len(prompt)
    for i in range(1, len(prompt)):
        assert lp[i][prompt[i]] == pytest.approx(ref[i - 1, prompt[i]], abs=1e-4)
    engine.kv.check_invariants()
    assert engine.kv.stats.num_used_blocks == 0


def test_all_sliding_model_one_group():
    """Mistral's case: every layer slides (one KV cache group, W=32); blocks slide out, tokens stay dense-equal."""
    model = init_model(load_config("tiny").replace(sliding_window=W), seed=5)
    engine = Engine(EngineConfig(model="tiny", num_blocks=24, block_size=BS, max_num_batched_tokens=48,
                                 pool_fill_value=float("nan")), model=model)
    # 236 tokens = 30 blocks kept whole; sliding, the sequence never holds more than 11 of the 24
    prompt = list(np.random.default_rng(5).integers(0, 250, 230))
    (out,) = _run(engine, [prompt], PARAMS)
    assert_dense_greedy(model, prompt, out.outputs[0].token_ids)
    assert engine.kv.num_slid_out_blocks > 0 and engine.kv.windows == (W,)
    assert out.metrics.peak_blocks_unshared <= 11
    engine.kv.check_invariants()
