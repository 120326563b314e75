"""Latency of one batch end to end, as ``vllm bench latency``: every engine flag, one batch, timed repeatedly.

    jaxpaged bench latency --model=small --batch_size=8 --input_len=32 --output_len=128 \\
        --num_iters_warmup=2 --num_iters=10 --json_out=out/latency.json

Each iteration generates ``--output_len`` tokens (EOS ignored, greedy) for all
``--batch_size`` prompts of ``--input_len`` random tokens; the warm-up
iterations compile the step shapes and are not reported. The prefix cache is
emptied before every iteration.
"""

from __future__ import annotations

from jaxpaged.bench.offline.latency import run_latency
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
ENGINE = EngineFlags(FLAGS)
INPUT_LEN = FLAGS.DEFINE_integer("input_len", 32, "prompt tokens per request")
OUTPUT_LEN = FLAGS.DEFINE_integer("output_len", 128, "tokens generated per request")
BATCH_SIZE = FLAGS.DEFINE_integer("batch_size", 8, "requests in the batch")
WARMUP = FLAGS.DEFINE_integer("num_iters_warmup", 2, "untimed iterations first (they compile)")
ITERS = FLAGS.DEFINE_integer("num_iters", 10, "timed iterations")
OUT = OutputFlags(FLAGS)
FLAGS.positive("input_len", "output_len", "batch_size", "num_iters")
FLAGS.non_negative("num_iters_warmup")


def main(argv):
    """Build the engine, time the batch, print and write the latencies."""
    del argv
    config = ENGINE.config()  # checked once, here
    summary, table = run_latency(ENGINE.kwargs(), batch_size=BATCH_SIZE.value, input_len=INPUT_LEN.value,
                                 output_len=OUTPUT_LEN.value, num_iters_warmup=WARMUP.value, num_iters=ITERS.value,
                                 seed=config.seed)
    OUT.write({"engine": ENGINE.kwargs(), "input_len": INPUT_LEN.value, "output_len": OUTPUT_LEN.value,
               "batch_size": BATCH_SIZE.value, "num_iters_warmup": WARMUP.value, "num_iters": ITERS.value,
               **summary}, table)
