"""Tensor parallelism on forced host CPU devices: step time and memory per device for TP = 1, 2, 4.

    jaxpaged bench tensor-parallel --model=small --sizes=1,2,4 --json_out=out/tp.json

XLA_FLAGS defaults to 4 forced host devices (set it yourself for more). The CPU
gains no speed from splitting: the "devices" share the same cores and memory,
and every all-reduce is a copy. What the run shows is memory per device and
the cost of the collectives; GPU figures wait for a device.
"""

from __future__ import annotations

import os

from jaxpaged import distributed
from jaxpaged.bench.offline.tensor_parallel import tensor_parallel_report
from jaxpaged.checkpoint import model_config
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
FLAGS.adopt([distributed.COORDINATOR_ADDRESS, distributed.NUM_PROCESSES, distributed.PROCESS_ID])
SIZES = FLAGS.DEFINE_list("sizes", ["1", "2", "4"], "tensor-parallel sizes, run side by side")
DECODE_BATCH = FLAGS.DEFINE_integer("decode_batch", 32, "sequences in the decode step")
CONTEXT = FLAGS.DEFINE_integer("decode_context", 512, "context length of each decoding sequence")
PREFILL = FLAGS.DEFINE_integer("prefill_len", 512, "tokens in the prefill step")
ENGINE = EngineFlags(FLAGS, ["model", "block_size"], defaults={"model": "small"})
MODEL, BLOCK_SIZE = ENGINE.holders["model"], ENGINE.holders["block_size"]
ROUNDS = FLAGS.DEFINE_integer("rounds", 10, "timed rounds (each runs every size once); medians reported")
OUT = OutputFlags(FLAGS)
FLAGS.register_validator("sizes", lambda sizes: all(s.isdigit() and int(s) >= 1 for s in sizes),
                         "--sizes must be positive integers, e.g. 1,2,4")
FLAGS.positive("decode_batch", "decode_context", "prefill_len", "rounds")


def main(argv):
    """Time every tensor-parallel size side by side; print and write the table."""
    del argv
    # CPU: four host devices unless XLA_FLAGS says otherwise (read when JAX first starts its backend)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    distributed.initialize_from_flags()
    result, table = tensor_parallel_report(model_config(MODEL.value), [int(s) for s in SIZES.value],
                                           decode_batch=DECODE_BATCH.value, context=CONTEXT.value,
                                           prefill_len=PREFILL.value, block_size=BLOCK_SIZE.value,
                                           rounds=ROUNDS.value)
    if not distributed.is_leader():
        print(table)
        return
    OUT.write(result, table)
