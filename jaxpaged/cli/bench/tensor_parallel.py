"""Tensor parallelism on forced host CPU devices: step time and memory per device for TP = 1, 2, 4.

    jaxpaged bench tensor-parallel --model=small --sizes=1,2,4 --json_out=out/tp.json

XLA_FLAGS defaults to 4 forced host devices (set it yourself for more). The CPU
gains no speed from splitting: the "devices" share the same cores and memory,
and every all-reduce is a copy. What the run shows is memory per device and
the cost of the collectives; GPU figures wait for a device.
"""

from __future__ import annotations

import dataclasses
import os

from jaxpaged import distributed
from jaxpaged.bench.offline.step_timing import StepShape
from jaxpaged.bench.offline.tensor_parallel import tensor_parallel_report
from jaxpaged.bench.options import option
from jaxpaged.checkpoint import model_config
from jaxpaged.cli.options import CommandFlags


@dataclasses.dataclass(frozen=True)
class TensorParallelOptions(StepShape):
    """The sizes compared, the two steps, and the rounds."""

    sizes: tuple[int, ...] = option((1, 2, 4), "tensor-parallel sizes, run side by side", at_least=1)
    rounds: int = option(10, "timed rounds (each runs every size once); medians reported", at_least=1)


COMMAND = CommandFlags(TensorParallelOptions, engine=["model", "block_size"], engine_defaults={"model": "small"})
FLAGS = COMMAND.flags
FLAGS.adopt([distributed.COORDINATOR_ADDRESS, distributed.NUM_PROCESSES, distributed.PROCESS_ID])


def main(argv):
    """Time every tensor-parallel size side by side; print and write the table."""
    del argv
    # CPU: four host devices unless XLA_FLAGS says otherwise (read when JAX first starts its backend)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    distributed.initialize_from_flags()
    options = COMMAND.options()
    shape = StepShape(options.prefill_len, options.decode_batch, options.decode_context)
    result, table = tensor_parallel_report(model_config(COMMAND.engine_value("model")), list(options.sizes), shape,
                                           block_size=COMMAND.engine_value("block_size"), rounds=options.rounds)
    if not distributed.is_leader():
        print(table)
        return
    COMMAND.out.write(result, table)
