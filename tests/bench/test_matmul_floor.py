"""The matmul floor (a step's weight GEMMs alone) and the CPU-efficiency script built on it."""

import numpy as np
import pytest

from jaxpaged.bench.offline import cpu_efficiency
from jaxpaged.bench.offline.matmul_floor import (_weight_gemms, floor_input, matmul_flops, model_weight_matrices,
                                                 time_matmul_floor, torch_gemm_flops_per_second, torch_weight_gemms,
                                                 weight_flops_per_row)
from jaxpaged.config import load_config
from jaxpaged.model import init_model



@pytest.mark.parametrize("name", ["tiny", "small"])  # untied and tied embeddings
def test_floor_multiplies_every_weight_matrix_once(name):
    config = load_config(name)
    model = init_model(config)
    norms = config.num_layers * 2 * config.hidden_size + config.hidden_size
    lookup_table = 0 if config.tie_embeddings else config.vocab_size * config.hidden_size  # a gather, no GEMM
    assert matmul_flops(model, 3) == 2 * 3 * (config.num_params() - norms - lookup_table)
    *layers, (head,) = model_weight_matrices(model)
    assert len(layers) == config.num_layers
    assert head.shape == (config.hidden_size, config.vocab_size)
    if config.tie_embeddings:
        np.testing.assert_array_equal(head, np.asarray(model.embed_tokens.embedding[...]).T)
    assert time_matmul_floor(model, 4, repeats=2) > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_floor_multiplies_the_same_weights_as_the_xla_one(dtype):
    pytest.importorskip("torch")
    model = init_model(load_config("tiny"), dtype=dtype)
    x = floor_input(model, 5)
    assert x.dtype == dtype
    xla = np.asarray(_weight_gemms(x, model_weight_matrices(model)), np.float32)
    tolerance = 1e-4 if dtype == "float32" else 5e-2
    np.testing.assert_allclose(torch_weight_gemms(model, x), xla, rtol=tolerance, atol=tolerance * np.abs(xla).max())
    assert torch_gemm_flops_per_second(model, 4, repeats=1) > 0


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_flops_per_row_split_the_stack_from_the_lm_head(name):
    config = load_config(name)
    h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    per_layer = h * config.num_heads * d * 2 + h * config.num_kv_heads * d * 2 + 3 * h * i  # q, o, k, v, MLP
    layers, head = weight_flops_per_row(init_model(config))
    assert layers == 2 * config.num_layers * per_layer
    assert head == 2 * h * config.vocab_size


def test_cpu_efficiency_measures_on_one_runner():
    result = cpu_efficiency.measure("tiny", decode_batch=4, decode_context=40, prefill_lens=[32, 96],
                            block_size=16, repeats=2)
    rounds = np.array(result["decode_rounds_ms"])
    assert rounds.shape == (2, 2)  # one (decode step, floor) pair per repeat, alternating
    assert result["decode_over_floor"] == pytest.approx(np.median(rounds[:, 0] / rounds[:, 1]))
    assert result["decode_step_ms"] == pytest.approx(np.median(rounds[:, 0]))
    tps = result["prefill_tokens_per_s"]
    assert result["long_over_short_prefill"] == pytest.approx(tps["96"] / tps["32"])
    assert result["compiles"] == 3  # one decode shape and one per prefill length
    assert "**decode step / matmul floor**" in cpu_efficiency.markdown(result)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        cpu_efficiency.measure("tiny", 4, 40, [10_000], 16, 1)
