"""`jaxpaged calibrate`: fit the "cpu" device profile to measured steps of a real model on this machine, then validate it.

1. Calibration: `calibration_shapes` builds synthetic steps of varied shapes
   (pure prefills of several lengths, pure decode batches of several sizes and
   context lengths); `measure_batches` times the real `ModelRunner` on them,
   interleaved so machine noise hits every shape alike, and keeps the median
   per shape; `fit_profile` chooses the effective FLOP/s, bandwidth and
   overheads that minimise the squared relative error of the cost model's
   predictions.
2. Validation: the real engine serves the `mixed` workload (chunked prefills
   batched with decodes); its batches are replayed on the runner, interleaved
   with the calibration steps (side by side), and each step's measured time is
   compared with the fitted model's prediction, overall and by step kind.

`measure` takes the times; `load_measurements` reads them back from an earlier
result (to refit without measuring); `fit_and_validate` fits and reports;
`run_calibration` is the whole command.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.optimize

from jaxpaged.config import DEFAULT_BLOCK_SIZE, ModelConfig
from jaxpaged.mathutils import cdiv
from jaxpaged.report import markdown_table
from jaxpaged.runner.step_input import ScheduledSeq, build_step_input
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import DeviceProfile, save_profile

Shape = list[tuple[int, int]]  # (new tokens, context before) per sequence


def batch_shape(batch: Sequence[ScheduledSeq]) -> Shape:
    """The (new tokens, context before) pairs the cost model reads from a batch."""
    return [(len(s.token_ids), s.num_computed_tokens) for s in batch]


def synthetic_batch(shape: Shape, block_size: int, rng: np.random.Generator) -> list[ScheduledSeq]:
    """Scheduled sequences of the given shape over disjoint, shuffled blocks (contents irrelevant)."""
    needed = [cdiv(n + c, block_size) for n, c in shape]
    blocks = rng.permutation(sum(needed)).tolist()
    batch, at = [], 0
    for (n, c), k in zip(shape, needed):
        batch.append(ScheduledSeq(rng.integers(0, 256, n).tolist(), c, blocks[at:at + k]))
        at += k
    return batch


def calibration_shapes() -> list[Shape]:
    """Synthetic steps spanning what an engine runs: prefills, decode batches, chunked prefill + decodes.

    Prefills from scratch and over cached context; decode batches of 1 to 64
    sequences at short and long context; prefill chunks batched with decodes.
    Different from validation, which times the engine's own steps on a request
    workload.
    """
    shapes = [[(n, 0)] for n in (16, 64, 128, 256, 512)]
    shapes += [[(128, 0)] * 4, [(128, 512)], [(64, 896)] * 2, [(32, 256)] * 8, [(256, 640)]]
    shapes += [[(1, ctx)] * b for b in (1, 2, 4, 8, 16, 32, 64) for ctx in (128, 1024)]
    shapes += [[(256, 128)] + [(1, 512)] * 4, [(128, 384)] + [(1, 700)] * 12,
               [(192, 448), (64, 0)] + [(1, 600)] * 8]
    return shapes


def step_kind(shape: Shape) -> str:
    """"decode" (every sequence computes one token), "prefill" (none does), or "mixed"."""
    decodes = sum(1 for n, _ in shape if n == 1)
    return "decode" if decodes == len(shape) else "prefill" if decodes == 0 else "mixed"


def measure_batches(runner, batches: list[list[ScheduledSeq]], repeats: int) -> list[float]:
    """Median seconds of one step per batch on a `ModelRunner`, after one compile/warm-up call each.

    A step is timed from laying it out to its sampled ids on the host (a full round trip).
    """
    def run(batch):
        runner.execute(build_step_input(batch, runner.block_size))

    for batch in batches:
        run(batch)
    times = [[] for _ in batches]
    for _ in range(repeats):
        for i, batch in enumerate(batches):
            start = time.perf_counter()
            run(batch)
            times[i].append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def fit_profile(config: ModelConfig, shapes: list[Shape], measured: Sequence[float], *, name: str = "cpu",
                block_size: int = DEFAULT_BLOCK_SIZE, weight_bytes_per_param: float = 4.0,
                kv_bytes_per_element: float = 4.0, memory_bytes: int = 0, phase_overlap: bool = True,
                grid: np.ndarray | None = None) -> DeviceProfile:
    """The profile (padded shapes) whose predictions have the least relative squared error.

    GEMM FLOP/s, attention FLOP/s and bandwidth are fitted separately: on a
    CPU the XLA reference attention (gathers, masked softmax) runs far below
    GEMM speed. With `phase_overlap` (max of compute and memory per phase) the
    rates are searched on a log grid, overheads solved by least squares at each
    point; without it the model is linear in the inverse rates and overheads,
    solved at once by non-negative least squares.
    """
    measured = np.asarray(measured, float)
    probe = CostModel(config, DeviceProfile(name, 1.0, 1.0, 0.0, memory_bytes, padded_shapes=True),
                      block_size=block_size, weight_bytes_per_param=weight_bytes_per_param,
                      kv_bytes_per_element=kv_bytes_per_element)
    costs = [probe.step_cost(s) for s in shapes]
    if not phase_overlap:
        return _fit_linear(name, costs, measured, memory_bytes)
    work = np.array([[c.dense_flops, c.dense_bytes, c.attn_flops, c.attn_bytes] for c in costs])
    counts = np.array([[1.0, c.num_seqs] for c in costs])
    best = (np.inf, None)
    grid = np.logspace(8, 13, 51) if grid is None else np.asarray(grid, float)
    for flops in grid:
        dense = np.maximum(work[:, 0] / flops, work[:, 1] / grid[:, None])  # [bandwidth, shape]
        for attn_flops in grid[grid <= flops]:
            attn = np.maximum(work[:, 2] / attn_flops, work[:, 3] / grid[:, None])
            for i, bw in enumerate(grid):
                overheads, err = _fit_overheads(measured, dense[i] + attn[i], counts)
                if err < best[0]:
                    best = (err, (flops, attn_flops, bw, *overheads))
    flops, attn_flops, bw, step_oh, seq_oh = best[1]
    return DeviceProfile(name, peak_flops=float(flops), memory_bandwidth=float(bw),
                         step_overhead_s=float(step_oh), memory_bytes=memory_bytes, padded_shapes=True,
                         per_seq_overhead_s=float(seq_oh), attention_flops=float(attn_flops))


def _fit_linear(name: str, costs: list, measured: np.ndarray, memory_bytes: int) -> DeviceProfile:
    """Sum-of-phases fit: time = step + seq * S + dense_flops / F + attn_flops / A + attn_bytes / BW."""
    features = np.array([[1.0, c.num_seqs, c.dense_flops, c.attn_flops, c.attn_bytes] for c in costs])
    w = 1.0 / measured  # relative error: weight each row by 1 / measured
    coef, _ = scipy.optimize.nnls(features * w[:, None], measured * w)
    step_oh, seq_oh, per_flop, per_attn_flop, per_byte = (float(c) for c in coef)
    tiny = 1e-30  # a zero coefficient: that work costs nothing here (an effectively infinite rate)
    return DeviceProfile(name, peak_flops=1 / max(per_flop, tiny), memory_bandwidth=1 / max(per_byte, tiny),
                         step_overhead_s=step_oh, memory_bytes=memory_bytes, padded_shapes=True,
                         per_seq_overhead_s=seq_oh, attention_flops=1 / max(per_attn_flop, tiny),
                         phase_overlap=False)


def _fit_overheads(measured: np.ndarray, roof: np.ndarray, counts: np.ndarray) -> tuple[tuple[float, ...], float]:
    """Non-negative overheads (per step, per sequence) minimising relative squared error, and that error."""
    w = 1.0 / measured  # relative error: weight each row by 1 / measured
    a = counts * w[:, None]
    b = (measured - roof) * w
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    coef = np.maximum(coef, 0.0)
    resid = a @ coef - b
    return tuple(float(c) for c in coef), float(resid @ resid)


@dataclasses.dataclass(frozen=True)
class ErrorSummary:
    """Relative errors |predicted - measured| / measured over a set of steps."""

    median: float
    p90: float
    max: float
    num_steps: int


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> ErrorSummary:
    """Summarise per-step relative prediction errors."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    err = np.abs(p - m) / m
    return ErrorSummary(float(np.median(err)), float(np.percentile(err, 90)), float(err.max()), len(err))


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
    shapes = calibration_shapes()
    cal_batches = [synthetic_batch(s, block_size, rng) for s in shapes]
    requests = make_workload("mixed", num_requests=num_requests, seed=1, max_prompt_len=768, max_output_len=48)
    engine_config = EngineConfig(model=model_name, block_size=block_size, num_blocks=num_blocks,
                                 max_num_seqs=32, max_num_batched_tokens=256)
    val_batches = record_engine_batches(runner, engine_config, requests)
    times = measure_batches(runner, cal_batches + val_batches, repeats)
    return Measurements(shapes, times[:len(shapes)], [batch_shape(b) for b in val_batches],
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
        rows = [i for i, s in enumerate(shapes) if step_kind(s) == kind]
        if rows:
            out[kind] = relative_errors([predicted[i] for i in rows], [measured[i] for i in rows])
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
    profile = fit_profile(config, m.shapes, m.times, block_size=block_size, phase_overlap=phase_overlap,
                                    weight_bytes_per_param=itemsize, kv_bytes_per_element=itemsize)
    model = CostModel(config, profile, block_size=block_size, weight_bytes_per_param=itemsize,
                      kv_bytes_per_element=itemsize)
    cal_err = relative_errors([model.step_time(s) for s in m.shapes], m.times)
    predicted = [model.step_time(s) for s in m.validation_shapes]
    val_err = relative_errors(predicted, m.validation_times)
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
