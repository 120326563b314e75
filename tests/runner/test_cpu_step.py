"""The step's CPU settings (`jaxpaged.runner.cpu_step`): compile options that reach the compiled step, and
decode steps padded to two rows with the results of one."""

import jax
import numpy as np
import pytest

from jaxpaged.engine import EngineConfig
from jaxpaged.model import cpu_gemm, init_model
from jaxpaged.runner import ModelRunner, cpu_step
from jaxpaged.runner.buckets import step_buckets
from jaxpaged.runner.step_input import ScheduledSeq, build_step_input
from tests.paged_driver import dense_check, drive

BS = 4
YNN_FUSION = '"kind":"__ynn_fusion"'  # a YNNPACK fusion, jaxlib's default dot path

cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's options and padding")


def _decode_step(num_decodes: int, min_decode_rows: int = 1):
    seqs = [ScheduledSeq([7 + i], 5, [2 * i, 2 * i + 1]) for i in range(num_decodes)]
    return build_step_input(seqs, BS, min_decode_rows=min_decode_rows)


def test_the_setting_picks_options_on_cpu_only_and_rejects_unknown_names():
    eigen = cpu_step.PRESETS["eigen"]
    assert cpu_step.step_compiler_options("eigen", "cpu", "float32", 512) == eigen  # a preset: every step
    assert cpu_step.step_compiler_options("eigen", "gpu", "float32", 1) == {}  # never on the GPU path
    assert cpu_step.step_compiler_options("off", "cpu", "float32", 1) == {}
    for dtype in ("float32", "bfloat16"):  # auto: what AUTO_PRESETS lists, on steps up to its size
        preset, max_tokens = cpu_step.AUTO_PRESETS.get(dtype, (None, 0))
        for tokens in (1, 2, 64):
            want = cpu_step.PRESETS[preset] if preset and tokens <= max_tokens else {}
            assert cpu_step.step_compiler_options("auto", "cpu", dtype, tokens) == want
        assert cpu_step.step_compiler_options("auto", "gpu", dtype, 1) == {}
    assert cpu_step.min_decode_rows("cpu", "bfloat16") == cpu_step.min_decode_rows("cpu", "float32") == 2
    assert cpu_step.min_decode_rows("gpu", "bfloat16") == cpu_step.min_decode_rows("gpu", "float32") == 1
    with pytest.raises(ValueError, match="cpu_compiler_options"):
        cpu_step.step_compiler_options("fast", "cpu", "float32", 1)
    with pytest.raises(ValueError, match="cpu_compiler_options"):
        EngineConfig(cpu_compiler_options="fast")


def test_decode_rows_pad_to_the_minimum_only_where_there_are_decodes():
    assert step_buckets(1, 0, 0, 0, 3, min_decode_rows=2).num_decode_rows == 2
    assert step_buckets(3, 0, 0, 0, 3, min_decode_rows=2).num_decode_rows == 4
    assert step_buckets(0, 1, 20, 20, 5, min_decode_rows=2).num_decode_rows == 0  # a prefill-only step
    assert step_buckets(1, 0, 0, 0, 3).num_decode_rows == 1


@cpu_only
def test_compile_options_reach_the_compiled_step(tiny_model):
    """With the `eigen` preset (YNNPACK's fusions off) the step's optimised HLO has no YNNPACK fusion, so its
    options reached the compiler; with "off" it has jaxlib's default, YNNPACK fusions."""
    step = _decode_step(2)
    hlo = {setting: ModelRunner(tiny_model, 8, BS, cpu_compiler_options=setting).lower(step).compile().as_text()
           for setting in ("eigen", "off")}
    assert YNN_FUSION not in hlo["eigen"]
    assert YNN_FUSION in hlo["off"]


@cpu_only
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_decode_pads_to_two_rows_with_the_result_of_one(tiny_config, dtype):
    """One decode laid out in two rows (the padding row masked) gives the logits and token of one row."""
    runner = ModelRunner(init_model(tiny_config, seed=0, dtype=dtype), 8, BS)
    assert runner.min_decode_rows == 2 and runner.input_batch.min_decode_rows == 2
    padded, single = _decode_step(1, runner.min_decode_rows), _decode_step(1)
    assert padded.layout.num_decode_seqs == 2 and padded.slot_mapping[1] == -1 and padded.context_lens[1] == 0
    want = runner.execute(single, return_logits=True)  # one row: XLA:CPU's matrix-vector dots
    got = runner.execute(padded, return_logits=True)
    tolerance = 1e-5 if dtype == "float32" else 0.02
    np.testing.assert_allclose(np.asarray(got.logits, np.float32), np.asarray(want.logits, np.float32),
                               rtol=tolerance, atol=tolerance)
    assert got.token_ids.tolist() == want.token_ids.tolist()


def test_the_gemm_setting_routes_on_one_cpu_device_only(monkeypatch):
    """`cpu_gemm`: oneDNN takes every product of the weights' dtype with "onednn", what `AUTO_GEMM_ROWS` lists for
    it with "auto", none with "xla", off the CPU platform, with tensor parallelism, or where the oneDNN GEMM
    is not available."""
    monkeypatch.setattr(cpu_gemm, "_supports", lambda name: True)  # a CPU with both (oneDNN: no bf16 on AVX2)
    for dtype in ("float32", "bfloat16"):
        assert cpu_step.gemm_route("onednn", "cpu", dtype).rows == tuple(r for r in cpu_step.EVERY_ROW
                                                                         if r[0] == dtype)
        auto = tuple(r for r in cpu_step.AUTO_GEMM_ROWS if r[0] == dtype)
        route = cpu_step.gemm_route("auto", "cpu", dtype)
        assert (route is None and not auto) or route.rows == auto
        assert cpu_step.gemm_route("xla", "cpu", dtype) is None
        assert cpu_step.gemm_route("onednn", "gpu", dtype) is None
        assert cpu_step.gemm_route("onednn", "cpu", dtype, tensor_parallel_size=2) is None
    with pytest.raises(ValueError, match="cpu_gemm must be one of"):
        cpu_step.gemm_route("mkl", "cpu", "float32")
    with pytest.raises(ValueError, match="cpu_gemm"):
        EngineConfig(cpu_gemm="mkl")
    monkeypatch.setattr(cpu_gemm, "available", lambda dtype=None: False)
    assert cpu_step.gemm_route("onednn", "cpu", "float32") is None


@cpu_only
def test_onednn_gemms_give_the_dense_forward(tiny_model, tiny_config):
    """Every weight GEMM through oneDNN (`cpu_gemm="onednn"`): the paged steps' logits and greedy tokens equal
    the dense forward's (XLA's dots), over prefill chunks mixed with decodes."""
    rng = np.random.default_rng(5)
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=BS, cpu_gemm="onednn")
    assert cpu_gemm.TARGET in runner.lower(_decode_step(2)).as_text()
    prompts = [list(rng.integers(0, tiny_config.vocab_size, n)) for n in (5, 17, 9)]
    dense_check(tiny_model, drive(runner, prompts, max_new=5, chunk=7, rng=rng))
