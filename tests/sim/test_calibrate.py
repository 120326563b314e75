"""Calibration: the fit recovers a known profile; the recorder sees the engine's batches."""

import numpy as np
import pytest

from jaxpaged.config import load_config
from jaxpaged.engine import EngineConfig
from jaxpaged.sim import calibrate
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import DeviceProfile
from jaxpaged.sim.runner import SimClock, SimulatedRunner
from jaxpaged.sim.validate import record_engine_batches
from jaxpaged.sim.workloads import make_workload

TRUE = DeviceProfile("true", peak_flops=1e11, memory_bandwidth=1e10, step_overhead_s=0.01, memory_bytes=0,
                     padded_shapes=True, per_seq_overhead_s=1e-4,
                     attention_flops=1e10)


def test_fit_recovers_a_known_profile():
    cfg = load_config("small")
    truth = CostModel(cfg, TRUE, weight_bytes_per_param=4, kv_bytes_per_element=4)
    shapes = calibrate.calibration_shapes()
    measured = [truth.step_time(s) for s in shapes]
    fitted = calibrate.fit_profile(cfg, shapes, measured, grid=np.logspace(9, 12, 13))
    assert fitted.peak_flops == pytest.approx(1e11)
    assert fitted.attention_flops == pytest.approx(1e10)
    assert fitted.memory_bandwidth == pytest.approx(1e10)
    assert fitted.step_overhead_s == pytest.approx(0.01, rel=1e-6)
    assert fitted.per_seq_overhead_s == pytest.approx(1e-4, rel=1e-6)


def test_linear_fit_recovers_a_profile_whose_phases_add():
    cfg = load_config("small")
    true = DeviceProfile("true", peak_flops=6e10, memory_bandwidth=4e9, step_overhead_s=0.008, memory_bytes=0,
                         padded_shapes=True, per_seq_overhead_s=3e-4, attention_flops=3e10, phase_overlap=False)
    truth = CostModel(cfg, true, weight_bytes_per_param=4, kv_bytes_per_element=4)
    shapes = calibrate.calibration_shapes()
    fitted = calibrate.fit_profile(cfg, shapes, [truth.step_time(s) for s in shapes], phase_overlap=False)
    assert not fitted.phase_overlap
    for field in ("peak_flops", "memory_bandwidth", "step_overhead_s", "per_seq_overhead_s", "attention_flops"):
        assert getattr(fitted, field) == pytest.approx(getattr(true, field), rel=1e-6), field
    # the sum of phases, not the max: a prefill's dense and attention times add up
    cost = truth.step_cost([(256, 640)])
    assert truth.step_time([(256, 640)]) == pytest.approx(
        0.008 + 3e-4 + cost.dense_flops / 6e10 + cost.attn_flops / 3e10 + cost.attn_bytes / 4e9)


def test_relative_errors():
    e = calibrate.relative_errors([1.1, 0.5, 2.0], [1.0, 1.0, 1.0])
    assert (e.median, e.max, e.num_steps) == (pytest.approx(0.5), pytest.approx(1.0), 3)


def test_synthetic_batch_has_the_shape_asked_for():
    shape = [(5, 0), (1, 37)]
    batch = calibrate.synthetic_batch(shape, 16, np.random.default_rng(0))
    assert calibrate.batch_shape(batch) == shape
    assert [len(b.block_table) for b in batch] == [1, 3]
    assert calibrate.step_kind(shape) == "mixed"
    assert calibrate.step_kind([(1, 37)] * 3) == "decode" and calibrate.step_kind([(5, 0)]) == "prefill"


def test_recorder_sees_every_engine_batch():
    cfg = load_config("tiny")
    clock = SimClock()
    runner = SimulatedRunner(cfg, CostModel(cfg, TRUE), clock, num_blocks=64)
    requests = make_workload("mixed", num_requests=6, min_output_len=2, max_prompt_len=40, max_output_len=5)
    batches = record_engine_batches(runner, EngineConfig(model="tiny", num_blocks=64, max_num_batched_tokens=32),
                                    requests)
    assert len(batches) == runner.num_steps
    assert sum(len(s.token_ids) for b in batches for s in b) == sum(
        len(r.prompt_token_ids) + r.max_tokens - 1 for r in requests)  # each sampled token but the last is fed back
