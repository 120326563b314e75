"""Prefill and decode step timings on one config (the foundation's step benchmark).

    jaxpaged bench step --model=small --prefill_len=512 --decode_batch=32
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.offline.step_timing import StepShape, time_prefill_and_decode
from jaxpaged.bench.options import option
from jaxpaged.checkpoint import model_config
from jaxpaged.cli.options import CommandFlags


@dataclasses.dataclass(frozen=True)
class StepOptions(StepShape):
    """The two steps and how often each is timed."""

    repeats: int = option(10, "timed repeats per step (median reported)", at_least=1)


COMMAND = CommandFlags(StepOptions, engine=["model", "block_size"], engine_defaults={"model": "small"})
FLAGS = COMMAND.flags


def main(argv):
    """Time one prefill step and one decode step; print and write the table."""
    del argv
    options = COMMAND.options()
    COMMAND.out.write(*time_prefill_and_decode(model_config(COMMAND.engine_value("model")), options,
                                               block_size=COMMAND.engine_value("block_size"), repeats=options.repeats))
