"""The weight-GEMM floor of a throughput pass, and how the throughput report uses it."""

import pytest

from jaxpaged.bench.offline.backend_run import BackendRun
from jaxpaged.bench.offline.throughput import GemmFloor, measure_gemm_floor
from jaxpaged.bench.offline.throughput import throughput_result, throughput_table
from jaxpaged.config import load_config
from jaxpaged.model import init_model

FLOOR = GemmFloor(layer_flops_per_row=1000, head_flops_per_row=300, prefill_rows=512, prefill_flops_per_s=1e6,
                  decode_rows=8, decode_flops_per_s=5e5)


def test_floor_counts_prompt_rows_fed_back_rows_and_lm_head_rows():
    summary = {"prompt_tokens_computed": 100, "output_tokens": 40, "num_requests": 4}
    # 100 prompt rows at the prefill rate; 36 generated rows fed back + 40 LM-head rows at the decode rate
    assert FLOOR.seconds(summary) == pytest.approx(100 * 1000 / 1e6 + (36 * 1000 + 40 * 300) / 5e5)


def _run(backend, elapsed, computed=None):
    return BackendRun(backend, [[1, 2], [3, 4]], elapsed, warmup_s=1.0, load_s=1.0, prompt_tokens_computed=computed)


def test_report_holds_each_pass_to_its_floor_and_bounds_the_ratio():
    prompts = [[0] * 30, [0] * 30]
    runs = {"jaxpaged": [_run("jaxpaged", 2.0, computed=40), _run("jaxpaged", 3.0, computed=40)],
            "hf": [_run("hf", 4.0), _run("hf", 6.0)]}
    result = throughput_result(runs, prompts, FLOOR)
    jp, hf = result["median"]["jaxpaged"], result["median"]["hf"]
    assert jp["prompt_tokens_computed"] == 40 and hf["prompt_tokens_computed"] == 60  # hf: every prompt token
    jp_floor = FLOOR.seconds({"prompt_tokens_computed": 40, "output_tokens": 4, "num_requests": 2})
    assert jp["gemm_floor_s"] == pytest.approx(jp_floor)
    assert jp["elapsed_over_gemm_floor"] == pytest.approx(2.5 / jp_floor)
    assert hf["gemm_floor_s"] > jp["gemm_floor_s"]  # more prompt rows
    bound = result["ratios"]["largest possible at the GEMM floor: hf elapsed / jaxpaged floor"]
    assert bound == pytest.approx(5.0 / jp_floor)
    assert result["gemm_floor"]["decode_rows"] == 8
    table = throughput_table(result)
    assert "| weight-GEMM floor (s) |" in table and "largest possible at the GEMM floor" in table


def test_a_onednn_rate_gives_a_second_floor_and_its_bound():
    floor = GemmFloor(1000, 300, 512, 1e6, 8, 5e5, onednn_prefill_flops_per_s=2e6, onednn_decode_flops_per_s=1e6)
    summary = {"prompt_tokens_computed": 100, "output_tokens": 40, "num_requests": 4}
    assert floor.seconds(summary, onednn=True) == pytest.approx(floor.seconds(summary) / 2)  # both rates doubled
    runs = {"jaxpaged": [_run("jaxpaged", 2.0, computed=40)], "vllm": [_run("vllm", 1.0)]}
    result = throughput_result(runs, [[0] * 30, [0] * 30], floor)
    jp = result["median"]["jaxpaged"]
    assert jp["onednn_gemm_floor_s"] == pytest.approx(jp["gemm_floor_s"] / 2)
    bound = result["ratios"]["largest possible with oneDNN's GEMMs: vllm elapsed / jaxpaged floor at oneDNN's FLOP/s"]
    assert bound == pytest.approx(1.0 / jp["onednn_gemm_floor_s"])
    assert "| weight-GEMM floor at oneDNN's FLOP/s (s) |" in throughput_table(result)
    assert "onednn_gemm_floor_s" not in throughput_result(runs, [[0] * 30, [0] * 30], FLOOR)["median"]["jaxpaged"]


def test_report_without_a_floor_leaves_its_rows_out():
    result = throughput_result({"hf": [_run("hf", 4.0)]}, [[0] * 30, [0] * 30])
    assert "gemm_floor_s" not in result["median"]["hf"] and "gemm_floor" not in result
    assert "GEMM floor" not in throughput_table(result)


def test_measured_rates_are_positive_and_rows_are_checked():
    model = init_model(load_config("tiny"))
    floor = measure_gemm_floor(model, prefill_rows=64, decode_rows=4, repeats=1)
    assert floor.prefill_flops_per_s > 0 and floor.decode_flops_per_s > 0
    assert floor.onednn_prefill_flops_per_s > 0 and floor.onednn_decode_flops_per_s > 0  # torch: a test extra
    assert (floor.prefill_rows, floor.decode_rows) == (64, 4)
    with pytest.raises(ValueError, match="decode_rows must be at least 1"):
        measure_gemm_floor(model, prefill_rows=64, decode_rows=0)
