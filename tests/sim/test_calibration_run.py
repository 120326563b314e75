"""`jaxpaged calibrate`'s fit and report, on step times a known profile predicts (no runner is timed)."""

import json

import numpy as np
import pytest

from jaxpaged.config import load_config
from jaxpaged.sim import calibrate
from jaxpaged.sim.calibrate import Measurements, errors_by_kind, fit_and_validate, load_measurements
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import DeviceProfile

TRUE = DeviceProfile("true", peak_flops=6e10, memory_bandwidth=4e9, step_overhead_s=0.008, memory_bytes=0,
                     padded_shapes=True, per_seq_overhead_s=3e-4, attention_flops=3e10, phase_overlap=False)
VALIDATION = [[(1, 100)] * 3, [(64, 0)], [(32, 16), (1, 40)], [(1, 300)], [(128, 0), (1, 5), (1, 9)]]


def test_errors_by_kind_are_each_kinds_own_relative_errors():
    predicted, measured = [1.1, 2.0, 2.7, 0.8, 5.0], [1.0, 2.5, 3.0, 1.0, 4.0]
    by_kind = errors_by_kind(VALIDATION, predicted, measured)
    assert list(by_kind) == ["decode", "prefill", "mixed"]
    assert by_kind["decode"].num_steps == 2 and by_kind["decode"].median == pytest.approx(np.median([0.1, 0.2]))
    assert by_kind["decode"].max == pytest.approx(0.2)
    assert by_kind["prefill"].median == pytest.approx(0.2) and by_kind["prefill"].num_steps == 1
    assert by_kind["mixed"].max == pytest.approx(0.25) and by_kind["mixed"].median == pytest.approx(0.175)
    assert "prefill" not in errors_by_kind(VALIDATION[:1], [1.0], [1.0])


def test_a_profile_whose_phases_add_is_recovered_and_a_written_result_refits_the_same(tmp_path):
    config = load_config("small")
    itemsize = np.dtype(config.dtype).itemsize
    truth = CostModel(config, TRUE, weight_bytes_per_param=itemsize, kv_bytes_per_element=itemsize)
    shapes = calibrate.calibration_shapes()
    m = Measurements(shapes, [truth.step_time(s) for s in shapes], VALIDATION,
                     [truth.step_time(s) * 1.1 for s in VALIDATION])  # validation runs 10% slower
    cal = fit_and_validate(config, m, date="then")
    assert cal.calibration_error.max < 1e-6
    assert cal.validation_error.median == pytest.approx(1 / 11, rel=1e-4)  # |t - 1.1 t| / 1.1 t
    assert cal.predicted == pytest.approx([truth.step_time(s) for s in VALIDATION], rel=1e-5)
    assert [line.split(" | ")[0] for line in cal.table.splitlines()[2:]] == [
        "| calibration (synthetic steps)", "| validation, all engine steps (mixed workload)",
        "| validation, decode steps", "| validation, prefill steps", "| validation, mixed steps"]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(cal.result))
    again = fit_and_validate(config, load_measurements(path), date="then")
    assert again.profile == cal.profile and again.result == json.loads(path.read_text())
