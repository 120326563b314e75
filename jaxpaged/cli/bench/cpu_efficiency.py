"""How close one jitted step gets to what its arithmetic needs, side by side in one process.

    jaxpaged bench cpu-efficiency --model=llama-100m --decode_batch=64 --decode_context=320 \
        --prefill_lens=512,4096 --md_out=out/cpu_efficiency.md

Two measurements, each a ratio of times taken in this run (the machine is shared,
so absolute times drift; ratios measured side by side drift less):
  * decode: a `decode_batch`-sequence decode step at `decode_context` tokens of
    context, against its matmul floor (the step's weight GEMMs alone, on the same
    weights: jaxpaged/bench/offline/matmul_floor.py). 1.0 would be a step that is all matmul.
    The two are timed in alternating rounds; the ratio is the median of the
    rounds' ratios.
  * prefill: tokens/s of a one-sequence prefill at each of `prefill_lens`; the
    ratio is the longest's tokens/s over the shortest's (1.0: context length is free).
With `--breakdown` (default) a `jax.profiler` trace of the decode step and of the
longest prefill is split by the code each XLA op came from (attention, MLP, LM
head, K/V write, sampling, ...: jaxpaged/bench/offline/step_profile.py).
"""

from __future__ import annotations

from jaxpaged.bench.offline.cpu_efficiency import markdown, measure
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
DECODE_BATCH = FLAGS.DEFINE_integer("decode_batch", 64, "sequences in the decode step")
CONTEXT = FLAGS.DEFINE_integer("decode_context", 320, "context length of each decoding sequence")
PREFILL_LENS = FLAGS.DEFINE_list("prefill_lens", ["512", "4096"], "one-sequence prefill lengths to compare")
ENGINE = EngineFlags(FLAGS, ["model", "block_size"], defaults={"model": "small"})
MODEL, BLOCK_SIZE = ENGINE.holders["model"], ENGINE.holders["block_size"]
REPEATS = FLAGS.DEFINE_integer("repeats", 5, "timed repeats per measurement (median reported)")
OUT = OutputFlags(FLAGS)
BREAKDOWN = FLAGS.DEFINE_boolean("breakdown", True,
                                 "trace the decode step and the longest prefill and split their time by part")

FLAGS.positive("decode_batch", "decode_context", "repeats")
FLAGS.list_of("prefill_lens", integer_at_least=1)


def main(argv):
    """Measure both ratios; print and write the tables."""
    del argv
    result = measure(MODEL.value, DECODE_BATCH.value, CONTEXT.value, [int(n) for n in PREFILL_LENS.value],
                     BLOCK_SIZE.value, REPEATS.value, BREAKDOWN.value)
    table = markdown(result)
    OUT.write(result, table)
