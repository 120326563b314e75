"""FP8 KV cache: scale validation, saturation, capacity, and agreement with a float32 pool.

The agreement test is teacher-forced: both pools see the same tokens (the
float32 pool's greedy choices), so one early disagreement cannot snowball, and
every generated position is compared. Tolerance, stated: top-1 agreement of at
least 95% and a max logit error of at most 20% of the logits' standard deviation.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.bench.capacity import kv_capacity
from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.kv_pool.fp8 import pool_absmax, scales_from_absmax, validate_kv_scales
from jaxpaged.kv_pool.pool import FP8_MAX, write_layer_kv
from jaxpaged.model import init_model
from jaxpaged.runner import ModelRunner, calibrate_kv_scales
from jaxpaged.runner.step_input import ScheduledSeq, build_step_input
from jaxpaged.sampling_params import SamplingParams

MIN_TOP1_AGREEMENT = 0.95
MAX_LOGIT_ERROR_PER_STD = 0.2


def test_validate_kv_scales_rejects_bad_shapes_and_values(tiny_config):
    good = np.ones((tiny_config.num_layers, tiny_config.num_kv_heads))
    k, v = validate_kv_scales(tiny_config, (good, 2 * good))
    assert k.dtype == np.float32 and np.all(v == 2)
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        validate_kv_scales(tiny_config, (good[:1], good))
    with pytest.raises(ValueError, match="finite and > 0"):
        validate_kv_scales(tiny_config, (good, 0 * good))
    with pytest.raises(ValueError, match="pair"):
        validate_kv_scales(tiny_config, good[0, 0])
    with pytest.raises(ValueError, match="at least 1.0"):
        EngineConfig(kv_scale_margin=0.5)


def test_fp8_write_saturates_instead_of_overflowing():
    pages = jnp.zeros((1, 2, 4, 2), jnp.float8_e4m3fn)
    scale = jnp.asarray([0.5], jnp.float32)
    new = jnp.asarray([[[1e6, -1e6]], [[1.0, -3.0]]], jnp.float32)  # [T=2, Hkv=1, D=2]
    k, _ = write_layer_kv(pages, pages, new, new, jnp.asarray([0, 5]), scale, scale)
    read = np.asarray(k.astype(jnp.float32)) * 0.5
    assert read[0, 0, 0].tolist() == [FP8_MAX * 0.5, -FP8_MAX * 0.5]  # clipped at the format's range
    assert read[0, 1, 1].tolist() == [1.0, -3.0]  # exactly representable values survive
    assert np.isfinite(read).all()


def test_capacity_quadruples_against_float32_and_doubles_against_bf16(tiny_config):
    plans = {d: kv_capacity(tiny_config, budget_bytes=1 << 20, context_len=256, kv_dtype=d)
             for d in ("float32", "bfloat16", "fp8_e4m3")}
    fp8 = plans["fp8_e4m3"]
    assert fp8.num_blocks == 2 * plans["bfloat16"].num_blocks == 4 * plans["float32"].num_blocks
    assert fp8.max_concurrent_seqs == 4 * plans["float32"].max_concurrent_seqs
    engines = {d: Engine(EngineConfig(model="tiny", kv_cache_bytes=1 << 20, kv_cache_dtype=d),
                         model=init_model(tiny_config)).num_blocks for d in ("float32", "fp8_e4m3")}
    assert engines["fp8_e4m3"] == fp8.num_blocks == 4 * engines["float32"]


def _teacher_forced(model, num_seqs, prompt_len, num_new, block_size=16):
    """Logits of a float32 and an fp8 pool fed the float32 pool's greedy tokens; fp8 scales from its first prefill."""
    rng = np.random.default_rng(0)
    tokens = [list(rng.integers(0, 250, prompt_len)) for _ in range(num_seqs)]
    per_seq = -(-(prompt_len + num_new) // block_size)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(num_seqs)]
    r32 = ModelRunner(model, num_seqs * per_seq, block_size, kv_dtype=jnp.float32)
    r8 = None
    computed = [0] * num_seqs
    logits32, logits8 = [], []
    for _ in range(num_new):
        step = build_step_input([ScheduledSeq(t[c:], c, tb) for t, c, tb in zip(tokens, computed, tables)],
                                block_size)
        out32 = r32.execute(step, return_logits=True)
        if r8 is None:  # calibrate on the first prefill (the pool held zeros before it)
            k_max, v_max = pool_absmax(r32.pool)
            scales = (scales_from_absmax(k_max), scales_from_absmax(v_max))
            r8 = ModelRunner(model, num_seqs * per_seq, block_size, kv_dtype=jnp.float8_e4m3fn,
                             kv_scales=scales)
        logits8.append(r8.execute(step, return_logits=True).logits)
        logits32.append(out32.logits)
        for i, t in enumerate(tokens):
            computed[i] = len(t)
            t.append(int(out32.logits[i].argmax()))
    return np.stack(logits32), np.stack(logits8)


@pytest.mark.parametrize("name,num_new", [("tiny", 64), ("small", 48)])
def test_fp8_agrees_with_float32(name, num_new, record_property):
    l32, l8 = _teacher_forced(init_model(load_config(name), seed=0), num_seqs=4, prompt_len=16,
                              num_new=num_new)
    agreement = float((l32.argmax(-1) == l8.argmax(-1)).mean())
    max_err = float(np.abs(l32 - l8).max())
    std = float(l32.std())
    record_property("fp8_top1_agreement", agreement)
    record_property("fp8_max_logit_error", max_err)
    print(f"\n{name}: {l32.shape[0] * l32.shape[1]} generated tokens, top-1 agreement {agreement:.4f}, "
          f"max logit error {max_err:.4f} (logit std {std:.3f})")
    assert agreement >= MIN_TOP1_AGREEMENT
    assert max_err <= MAX_LOGIT_ERROR_PER_STD * std
    assert max_err > 0  # the fp8 pool really was used


def test_engine_calibrates_on_first_prefill(tiny_model):
    rng = np.random.default_rng(4)
    prompts = [list(rng.integers(0, 250, n)) for n in (40, 9, 23)]
    engine = Engine(EngineConfig(model="tiny", num_blocks=32, kv_cache_dtype="fp8_e4m3"), model=tiny_model)
    assert np.all(np.asarray(engine.runner.pool.k_scale) == 1.0)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    expected = calibrate_kv_scales(tiny_model, prompts[0], 16)  # the first request's first chunk
    np.testing.assert_allclose(np.asarray(engine.runner.pool.k_scale), expected[0], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(engine.runner.pool.v_scale), expected[1], rtol=1e-5)
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs if o.finished)
    assert engine.kv.stats.num_used_blocks == 0


def test_pallas_fp8_path_matches_xla(tiny_model):
    """The Pallas kernel's fp8 option (interpreted on CPU) reads the same calibrated pool as the XLA path."""
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, 250, n)) for n in (20, 7)]
    tokens = {}
    for backend in ("xla", "pallas"):
        engine = Engine(EngineConfig(model="tiny", num_blocks=16, kv_cache_dtype="fp8_e4m3",
                                     attention_backend=backend, pallas_interpret=True), model=tiny_model)
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
        outs = []
        while engine.has_unfinished_requests():
            outs += engine.step()
        tokens[backend] = sorted((o.request_id, o.outputs[0].token_ids) for o in outs)
    assert tokens["xla"] == tokens["pallas"]
