"""Calibrate the "cpu" device profile on this machine, then validate it on a different workload.

    jaxpaged calibrate --json_out=out/sim_calibration.json

The calibration steps, the validation and the fit are `jaxpaged.sim.calibrate`;
the profile goes to `jaxpaged/sim/cpu_profile.json`.
"""

from __future__ import annotations

from jaxpaged import compile_cache
from jaxpaged.checkpoint import model_config
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.sim.calibrate import run_calibration
from jaxpaged.sim.profiles import CPU_PROFILE_PATH

FLAGS = FlagSet()
# the model to calibrate and validate on; 4200 blocks cover 64 x 1K-token decodes
ENGINE = EngineFlags(FLAGS, ["model", "block_size", "num_blocks", "compile_cache_dir"],
                     defaults={"model": "small", "num_blocks": 4200})
MODEL, BLOCK_SIZE, NUM_BLOCKS, COMPILE_CACHE_DIR = (
    ENGINE.holders[n] for n in ("model", "block_size", "num_blocks", "compile_cache_dir"))
REPEATS = FLAGS.DEFINE_integer("repeats", 5, "timed repeats per step, interleaved (median)")
NUM_REQUESTS = FLAGS.DEFINE_integer("num_requests", 32, "validation requests (mixed workload)")
SAVE = FLAGS.DEFINE_bool("save", True, f"write the fitted profile to {CPU_PROFILE_PATH.name}")
OUT = OutputFlags(FLAGS, plot_dir=None)
PLOT_NAME = FLAGS.DEFINE_string("plot_name", "sim_validation.png",
                                "file name of the predicted-vs-measured PNG in --plot_dir")
REFIT_FROM = FLAGS.DEFINE_string("refit_from", None, "refit from the measurements in an earlier --json_out")
OVERLAP = FLAGS.DEFINE_bool("phase_overlap", False, "fit the roofline max(compute, memory) per phase instead "
                            "of their sum")

FLAGS.positive("repeats", "num_requests")


def main(argv):
    """Measure (or refit), fit, validate; write the profile, the results and the predicted-vs-measured plot."""
    del argv
    compile_cache.configure(COMPILE_CACHE_DIR.value)  # reruns skip XLA compiles
    config = model_config(MODEL.value)
    measured, cal = run_calibration(MODEL.value, config, block_size=BLOCK_SIZE.value, num_blocks=NUM_BLOCKS.value,
                                    num_requests=NUM_REQUESTS.value, repeats=REPEATS.value,
                                    phase_overlap=OVERLAP.value, refit_from=REFIT_FROM.value, save=SAVE.value)
    val_times, predicted, title = measured.validation_times, cal.predicted, cal.plot_title(config.name)
    from jaxpaged.sim.plots import plot_validation
    OUT.write(cal.result, cal.table,
              plots={PLOT_NAME.value: lambda: plot_validation(val_times, predicted, title=title)})
