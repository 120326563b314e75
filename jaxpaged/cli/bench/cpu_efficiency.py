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

import dataclasses

from jaxpaged.bench.offline.cpu_efficiency import markdown, measure
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags


@dataclasses.dataclass(frozen=True)
class CpuEfficiencyOptions:
    """The decode step and prefills measured against their floors, and how."""

    decode_batch: int = option(64, "sequences in the decode step", at_least=1)
    decode_context: int = option(320, "context length of each decoding sequence", at_least=1)
    prefill_lens: tuple[int, ...] = option((512, 4096), "one-sequence prefill lengths to compare", at_least=1)
    repeats: int = option(5, "timed repeats per measurement (median reported)", at_least=1)
    breakdown: bool = option(True, "trace the decode step and the longest prefill and split their time by part")


COMMAND = CommandFlags(CpuEfficiencyOptions, engine=["model", "block_size"], engine_defaults={"model": "small"})
FLAGS = COMMAND.flags


def main(argv):
    """Measure both ratios; print and write the tables."""
    del argv
    o, engine = COMMAND.options(), COMMAND.engine.kwargs()
    result = measure(engine["model"], o.decode_batch, o.decode_context, list(o.prefill_lens), engine["block_size"],
                     o.repeats, o.breakdown)
    COMMAND.out.write(result, markdown(result))
