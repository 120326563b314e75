"""Calibrate the "cpu" device profile on this machine, then validate it on a different workload.

    jaxpaged calibrate --json_out=out/sim_calibration.json

1. Calibration: the small config's real ModelRunner on synthetic pure-prefill
   and pure-decode steps; fit FLOP/s, bandwidth and overheads
   (`jaxpaged/sim/calibrate.py`); the profile goes to `jaxpaged/sim/cpu_profile.json`.
2. Validation: the real engine serves the `mixed` workload (chunked prefills
   batched with decodes); its batches are replayed on the runner, interleaved
   with the calibration steps (side by side), and each step's measured time is
   compared with the fitted cost model's prediction, overall and by step kind
   (decode-only, prefill-only, prefill chunks batched with decodes).
"""

from __future__ import annotations

import datetime
import platform

import jax
import numpy as np

from jaxpaged.bench.output import markdown_table
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.config import load_config
from jaxpaged.engine import EngineConfig
from jaxpaged.model import init_model
from jaxpaged.runner import ModelRunner
from jaxpaged.sim import calibrate
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import CPU_PROFILE_PATH, save_profile
from jaxpaged.sim.validate import record_engine_batches
from jaxpaged.workloads import make_workload

FLAGS = FlagSet()
MODEL = FLAGS.DEFINE_string("model", "small", "model config to calibrate and validate on")
BLOCK_SIZE = EngineFlags(FLAGS, ["block_size"]).holders["block_size"]
NUM_BLOCKS = FLAGS.DEFINE_integer("num_blocks", 4200, "KV pool blocks (covers 64 x 1K-token decodes)")
REPEATS = FLAGS.DEFINE_integer("repeats", 5, "timed repeats per step, interleaved (median)")
NUM_REQUESTS = FLAGS.DEFINE_integer("num_requests", 32, "validation requests (mixed workload)")
SAVE = FLAGS.DEFINE_bool("save", True, f"write the fitted profile to {CPU_PROFILE_PATH.name}")
OUT = OutputFlags(FLAGS, plot_dir=None)
PLOT_NAME = FLAGS.DEFINE_string("plot_name", "sim_validation.png",
                                "file name of the predicted-vs-measured PNG in --plot_dir")
REFIT_FROM = FLAGS.DEFINE_string("refit_from", None, "refit from the measurements in an earlier --json_out")
OVERLAP = FLAGS.DEFINE_bool("phase_overlap", False, "fit the roofline max(compute, memory) per phase instead "
                            "of their sum")
COMPILE_CACHE = FLAGS.DEFINE_string("compile_cache", "out/jax-compile", "persistent XLA compilation cache")

FLAGS.model_name("model")
FLAGS.positive("num_blocks", "repeats", "num_requests")


def main(argv):
    del argv
    jax.config.update("jax_compilation_cache_dir", COMPILE_CACHE.value)  # reruns skip XLA compiles
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    config = load_config(MODEL.value)
    bs = BLOCK_SIZE.value
    if REFIT_FROM.value:
        shapes, cal_times, val_shapes, val_times = _load_measurements(REFIT_FROM.value)
    else:
        shapes, cal_times, val_shapes, val_times = _measure(config, bs)
    itemsize = np.dtype(config.dtype).itemsize
    # phases add on a CPU (no overlap of the XLA reference's gathers and matmuls); --phase_overlap to compare
    profile = calibrate.fit_profile(config, shapes, cal_times, block_size=bs, phase_overlap=OVERLAP.value,
                                    weight_bytes_per_param=itemsize, kv_bytes_per_element=itemsize)
    model = CostModel(config, profile, block_size=bs, weight_bytes_per_param=itemsize,
                      kv_bytes_per_element=itemsize)
    cal_err = calibrate.relative_errors([model.step_time(s) for s in shapes], cal_times)
    predicted = [model.step_time(s) for s in val_shapes]
    val_err = calibrate.relative_errors(predicted, val_times)
    by_kind = {}
    for kind in ("decode", "prefill", "mixed"):
        rows = [i for i, s in enumerate(val_shapes) if calibrate.step_kind(s) == kind]
        if rows:
            by_kind[kind] = calibrate.relative_errors([predicted[i] for i in rows], [val_times[i] for i in rows])

    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if SAVE.value:
        save_profile(profile, calibrated_on=config.name, date=when, machine=platform.processor() or "cpu",
                     calibration_median_rel_error=cal_err.median)
    print(f"profile: {profile}")
    rows = [("calibration (synthetic steps)", cal_err), ("validation, all engine steps (mixed workload)", val_err)]
    rows += [(f"validation, {kind} steps", e) for kind, e in by_kind.items()]
    table = markdown_table(["set", "steps", "median rel. error", "p90 rel. error", "max"],
                           [[label, e.num_steps, f"{e.median:.1%}", f"{e.p90:.1%}", f"{e.max:.1%}"] for label, e in rows])
    from jaxpaged.sim.plots import plot_validation
    title = f"{config.name} on this CPU: median error {val_err.median:.1%}, p90 {val_err.p90:.1%}"
    OUT.write({"date": when, "profile": profile.__dict__, "calibration": cal_err.__dict__,
               "validation_by_kind": {k: e.__dict__ for k, e in by_kind.items()},
               "calibration_steps": [{"shape": s, "measured_s": m} for s, m in zip(shapes, cal_times)],
               "validation": val_err.__dict__, "validation_steps": [
                   {"shape": s, "measured_s": float(m), "predicted_s": p}
                   for s, m, p in zip(val_shapes, val_times, predicted)]}, table,
              plots={PLOT_NAME.value: lambda: plot_validation(val_times, predicted, title=title)})


def _measure(config, bs: int):
    """Time the calibration shapes and the engine's validation batches, interleaved, on the real runner."""
    runner = ModelRunner(init_model(config, seed=0), num_blocks=NUM_BLOCKS.value, block_size=bs)
    rng = np.random.default_rng(0)
    shapes = calibrate.calibration_shapes()
    cal_batches = [calibrate.synthetic_batch(s, bs, rng) for s in shapes]
    requests = make_workload("mixed", num_requests=NUM_REQUESTS.value, seed=1, max_prompt_len=768,
                             max_output_len=48)
    engine_config = EngineConfig(model=MODEL.value, block_size=bs, num_blocks=NUM_BLOCKS.value,
                                 max_num_seqs=32, max_num_batched_tokens=256)
    val_batches = record_engine_batches(runner, engine_config, requests)
    times = calibrate.measure_batches(runner, cal_batches + val_batches, REPEATS.value)
    val_shapes = [calibrate.batch_shape(b) for b in val_batches]
    return shapes, times[:len(shapes)], val_shapes, times[len(shapes):]


def _load_measurements(path: str):
    """Calibration and validation steps from an earlier --json_out."""
    with open(path) as f:
        data = json.load(f)
    cal = data["calibration_steps"]
    val = data["validation_steps"]
    return ([s["shape"] for s in cal], [s["measured_s"] for s in cal],
            [s["shape"] for s in val], [s["measured_s"] for s in val])
