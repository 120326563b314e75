"""Calibrate the "cpu" device profile on this machine, then validate it on a different workload.

    jaxpaged calibrate --json_out=out/sim_calibration.json

The steps, the validation and the fit are `jaxpaged.sim.calibrate`; the profile goes to
`jaxpaged/sim/cpu_profile.json` (docs/benchmarks/simulator.md).
"""

from __future__ import annotations

import dataclasses

from jaxpaged import compile_cache
from jaxpaged.bench.options import option
from jaxpaged.checkpoint import model_config
from jaxpaged.cli.options import CommandFlags
from jaxpaged.sim.calibrate import run_calibration
from jaxpaged.sim.profiles import CPU_PROFILE_PATH


@dataclasses.dataclass(frozen=True)
class CalibrateOptions:
    """How the steps are timed, the validation workload, the fit, and where it goes."""

    repeats: int = option(5, "timed repeats per step, interleaved (median)", at_least=1)
    num_requests: int = option(32, "validation requests (mixed workload)", at_least=1)
    save: bool = option(True, f"write the fitted profile to {CPU_PROFILE_PATH.name}")
    plot_name: str = option("sim_validation.png", "file name of the predicted-vs-measured PNG in --plot_dir")
    refit_from: str | None = option(None, "refit from the measurements in an earlier --json_out")
    phase_overlap: bool = option(False, "fit the roofline max(compute, memory) per phase instead of their sum")


# the model to calibrate and validate on; 4200 blocks cover 64 x 1K-token decodes
COMMAND = CommandFlags(CalibrateOptions, engine=["model", "block_size", "num_blocks", "compile_cache_dir"],
                       engine_defaults={"model": "small", "num_blocks": 4200}, plot_dir=None)
FLAGS = COMMAND.flags


def main(argv):
    """Measure (or refit), fit, validate; write the profile, the results and the predicted-vs-measured plot."""
    del argv
    o, engine = COMMAND.options(), COMMAND.engine.kwargs()
    compile_cache.configure(engine["compile_cache_dir"])  # reruns skip XLA compiles
    config = model_config(engine["model"])
    measured, cal = run_calibration(engine["model"], config, block_size=engine["block_size"],
                                    num_blocks=engine["num_blocks"], num_requests=o.num_requests, repeats=o.repeats,
                                    phase_overlap=o.phase_overlap, refit_from=o.refit_from, save=o.save)
    val_times, predicted, title = measured.validation_times, cal.predicted, cal.plot_title(config.name)
    from jaxpaged.sim.plots import plot_validation
    COMMAND.out.write(cal.result, cal.table,
                      plots={o.plot_name: lambda: plot_validation(val_times, predicted, title=title)})
