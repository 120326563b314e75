"""Latency of one batch end to end, as ``vllm bench latency``: every engine flag, one batch, timed repeatedly.

    jaxpaged bench latency --model=small --batch_size=8 --input_len=32 --output_len=128 \\
        --num_iters_warmup=2 --num_iters=10 --json_out=out/latency.json

Each iteration generates ``--output_len`` greedy tokens (EOS ignored) for ``--batch_size`` prompts of
``--input_len`` random tokens, on an emptied prefix cache; the warm-up iterations compile and are not reported.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.offline.latency import run_latency
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags


@dataclasses.dataclass(frozen=True)
class LatencyOptions:
    """The batch and how often it is timed."""

    input_len: int = option(32, "prompt tokens per request", at_least=1)
    output_len: int = option(128, "tokens generated per request", at_least=1)
    batch_size: int = option(8, "requests in the batch", at_least=1)
    num_iters_warmup: int = option(2, "untimed iterations first (they compile)", at_least=0)
    num_iters: int = option(10, "timed iterations", at_least=1)


COMMAND = CommandFlags(LatencyOptions, engine=None)
FLAGS = COMMAND.flags


def main(argv):
    """Build the engine, time the batch, print and write the latencies."""
    del argv
    options, engine = dataclasses.asdict(COMMAND.options()), COMMAND.engine.kwargs()
    summary, table = run_latency(engine, **options, seed=COMMAND.engine.config().seed)  # the config checked here
    COMMAND.out.write({"engine": engine, **options, **summary}, table)
