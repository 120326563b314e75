"""Prefill and decode step timings on one config (the foundation's step benchmark).

    jaxpaged bench step --model=small --prefill_len=512 --decode_batch=32
"""

from __future__ import annotations

from jaxpaged.bench.offline.step_timing import step_table, time_prefill_and_decode
from jaxpaged.checkpoint import model_config
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
PREFILL = FLAGS.DEFINE_integer("prefill_len", 512, "tokens in the prefill step")
DECODE_BATCH = FLAGS.DEFINE_integer("decode_batch", 32, "sequences in the decode step")
CONTEXT = FLAGS.DEFINE_integer("decode_context", 512, "context length of each decoding sequence")
ENGINE = EngineFlags(FLAGS, ["model", "block_size"], defaults={"model": "small"})
MODEL, BLOCK_SIZE = ENGINE.holders["model"], ENGINE.holders["block_size"]
REPEATS = FLAGS.DEFINE_integer("repeats", 10, "timed repeats per step (median reported)")
OUT = OutputFlags(FLAGS)

FLAGS.positive("prefill_len", "decode_batch", "decode_context", "repeats")


def main(argv):
    """Time one prefill step and one decode step; print and write the table."""
    del argv
    result = time_prefill_and_decode(model_config(MODEL.value), prefill_len=PREFILL.value,
                                     decode_batch=DECODE_BATCH.value, decode_context=CONTEXT.value,
                                     block_size=BLOCK_SIZE.value, repeats=REPEATS.value)
    OUT.write(result, step_table(result))
