"""`jaxpaged calibrate`: fit the "cpu" device profile to this machine, then validate it on a different workload.

1. Calibration: a model's real `ModelRunner` on synthetic pure-prefill and
   pure-decode steps (`jaxpaged.sim.calibrate.calibration_shapes`); the cost
   model's FLOP/s, bandwidth and overheads are fitted to their times.
2. Validation: the real engine serves the `mixed` workload (chunked prefills
   batched with decodes); its batches are replayed on the runner, interleaved
   with the calibration steps (side by side), and each step's measured time is
   compared with the fitted model's prediction, overall and by step kind.

`measure` takes the times; `load_measurements` reads them back from an earlier
result (to refit without measuring); `fit_and_validate` fits and reports.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxpaged.report import markdown_table
from jaxpaged.config import DEFAULT_BLOCK_SIZE, ModelConfig
from jaxpaged.sim import calibrate
from jaxpaged.sim.calibrate import ErrorSummary, Shape
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import DeviceProfile, save_profile

STEP_KINDS = ("decode", "prefill", "mixed")


@dataclasses.dataclass(frozen=True)
class Measurements:
    """Seconds per step: the synthetic calibration steps and the engine's validation steps, with their shapes."""

    shapes: list[Shape]
    times: list[float]
    validation_shapes: list[Shape]
    validation_times: list[float]


@dataclasses.dataclass(frozen=True)
class Calibration:
    """A fitted profile, its errors, and the result and table a command writes."""

    profile: DeviceProfile
    calibration_error: ErrorSummary
    validation_error: ErrorSummary
    validation_by_kind: dict[str, ErrorSummary]
    predicted: list[float]  # per validation step
    result: dict
    table: str

    def plot_title(self, model_name: str) -> str:
        """The predicted-vs-measured plot's title."""
        return (f"{model_name} on this CPU: median error {self.validation_error.median:.1%}, "
                f"p90 {self.validation_error.p90:.1%}")


def measure(model_name: str, config: ModelConfig, *, block_size: int = DEFAULT_BLOCK_SIZE, num_blocks: int = 4200,
            num_requests: int = 32, repeats: int = 5) -> Measurements:
    """Time the calibration shapes and the engine's validation batches, interleaved, on the real runner."""
    from jaxpaged.engine import EngineConfig
    from jaxpaged.model import init_model
    from jaxpaged.runner import ModelRunner
    from jaxpaged.sim.validate import record_engine_batches
    from jaxpaged.sim.workloads import make_workload
    runner = ModelRunner(init_model(config, seed=0), num_blocks=num_blocks, block_size=block_size)
    rng = np.random.default_rng(0)
    shapes = calibrate.calibration_shapes()
    cal_batches = [calibrate.synthetic_batch(s, block_size, rng) for s in shapes]
    requests = make_workload("mixed", num_requests=num_requests, seed=1, max_prompt_len=768, max_output_len=48)
    engine_config = EngineConfig(model=model_name, block_size=block_size, num_blocks=num_blocks,
                                 max_num_seqs=32, max_num_batched_tokens=256)
    val_batches = record_engine_batches(runner, engine_config, requests)
    times = calibrate.measure_batches(runner, cal_batches + val_batches, repeats)
    return Measurements(shapes, times[:len(shapes)], [calibrate.batch_shape(b) for b in val_batches],
                        times[len(shapes):])


def load_measurements(path: str | Path) -> Measurements:
    """The calibration and validation steps of an earlier result (`Calibration.result` as JSON)."""
    data = json.loads(Path(path).read_text())
    cal, val = data["calibration_steps"], data["validation_steps"]
    return Measurements([s["shape"] for s in cal], [s["measured_s"] for s in cal],
                        [s["shape"] for s in val], [s["measured_s"] for s in val])


def errors_by_kind(shapes: Sequence[Shape], predicted: Sequence[float],
                   measured: Sequence[float]) -> dict[str, ErrorSummary]:
    """Relative errors over the decode-only, prefill-only and mixed steps (kinds with no step left out)."""
    out = {}
    for kind in STEP_KINDS:
        rows = [i for i, s in enumerate(shapes) if calibrate.step_kind(s) == kind]
        if rows:
            out[kind] = calibrate.relative_errors([predicted[i] for i in rows], [measured[i] for i in rows])
    return out


def error_table(calibration: ErrorSummary, validation: ErrorSummary, by_kind: dict[str, ErrorSummary]) -> str:
    """One row per step set: steps, median, p90 and max relative error."""
    rows = [("calibration (synthetic steps)", calibration), ("validation, all engine steps (mixed workload)", validation)]
    rows += [(f"validation, {kind} steps", e) for kind, e in by_kind.items()]
    return markdown_table(["set", "steps", "median rel. error", "p90 rel. error", "max"],
                          [[label, e.num_steps, f"{e.median:.1%}", f"{e.p90:.1%}", f"{e.max:.1%}"] for label, e in rows])


def fit_and_validate(config: ModelConfig, m: Measurements, *, block_size: int = DEFAULT_BLOCK_SIZE,
                     phase_overlap: bool = False, date: str | None = None) -> Calibration:
    """Fit the profile to the calibration steps and predict the validation steps with it.

    On a CPU the phases add (XLA runs the reference attention's gathers and the
    matmuls one after the other), hence ``phase_overlap=False`` by default.
    """
    date = date or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    itemsize = np.dtype(config.dtype).itemsize
    profile = calibrate.fit_profile(config, m.shapes, m.times, block_size=block_size, phase_overlap=phase_overlap,
                                    weight_bytes_per_param=itemsize, kv_bytes_per_element=itemsize)
    model = CostModel(config, profile, block_size=block_size, weight_bytes_per_param=itemsize,
                      kv_bytes_per_element=itemsize)
    cal_err = calibrate.relative_errors([model.step_time(s) for s in m.shapes], m.times)
    predicted = [model.step_time(s) for s in m.validation_shapes]
    val_err = calibrate.relative_errors(predicted, m.validation_times)
    by_kind = errors_by_kind(m.validation_shapes, predicted, m.validation_times)
    result = {"date": date, "profile": profile.__dict__, "calibration": cal_err.__dict__,
              "validation_by_kind": {k: e.__dict__ for k, e in by_kind.items()},
              "calibration_steps": [{"shape": s, "measured_s": t} for s, t in zip(m.shapes, m.times)],
              "validation": val_err.__dict__, "validation_steps": [
                  {"shape": s, "measured_s": float(t), "predicted_s": p}
                  for s, t, p in zip(m.validation_shapes, m.validation_times, predicted)]}
    return Calibration(profile, cal_err, val_err, by_kind, predicted, result, error_table(cal_err, val_err, by_kind))


def run_calibration(model_name: str, config: ModelConfig, *, block_size: int = DEFAULT_BLOCK_SIZE,
                    num_blocks: int = 4200, num_requests: int = 32, repeats: int = 5, phase_overlap: bool = False,
                    refit_from: str | None = None, save: bool = True) -> tuple[Measurements, Calibration]:
    """Measure (or read ``refit_from``), fit, validate; with ``save`` the profile goes to `CPU_PROFILE_PATH`."""
    if refit_from:
        m = load_measurements(refit_from)
    else:
        m = measure(model_name, config, block_size=block_size, num_blocks=num_blocks, num_requests=num_requests,
                    repeats=repeats)
    cal = fit_and_validate(config, m, block_size=block_size, phase_overlap=phase_overlap)
    if save:
        save_profile(cal.profile, calibrated_on=config.name, date=cal.result["date"],
                     machine=platform.processor() or "cpu", calibration_median_rel_error=cal.calibration_error.median)
    print(f"profile: {cal.profile}")
    return m, cal
