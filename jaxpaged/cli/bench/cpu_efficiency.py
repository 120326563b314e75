"""How close one jitted step gets to what its arithmetic needs, side by side in one process.

    jaxpaged bench cpu-efficiency --model=llama-100m --decode_batch=64 --decode_context=320 \\
        --prefill_lens=512,4096 --md_out=out/cpu_efficiency.md

The decode step over its matmul floor (its weight GEMMs alone, timed in alternating rounds; the median of the
rounds' ratios), and one-sequence prefill tokens/s, the longest of `--prefill_lens` over the shortest; with
`--breakdown`, each step's traced time split by the code its XLA ops came from (attention, MLP, LM head, ...).
docs/benchmarks/throughput.md, "The step-level targets".
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
