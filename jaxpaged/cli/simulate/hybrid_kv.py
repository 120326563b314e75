"""Simulated serving of a sliding-window model: the hybrid KV cache manager against every layer full.

    jaxpaged simulate hybrid-kv --model=gemma-3-27b --profile=h200-141gb --context_lens=8192,32768

Per context the same requests run with the model's windows and without: the pool, the most sequences
running at once, throughput (`jaxpaged.sim.hybrid_kv`). See docs/benchmarks/hybrid-kv.md.
"""

from __future__ import annotations

import dataclasses

from absl import app

from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags
from jaxpaged.sim.hybrid_kv import compare_layouts, layouts_table


@dataclasses.dataclass(frozen=True)
class HybridKVOptions:
    """The device, the contexts compared, and the requests of each run."""

    profile: str = option("h200-141gb", "device profile")
    context_lens: tuple[int, ...] = option((8192, 32768), "tokens per sequence (prompt + output)", at_least=1)
    num_requests: int = option(0, "requests per run (0: 1.5 x what the hybrid pool holds)")
    max_tokens: int = option(1024, "tokens generated per request (long enough that memory, not the prefill rate, "
                                   "bounds how many run at once)", at_least=1)


COMMAND = CommandFlags(HybridKVOptions, engine=["model"], engine_defaults={"model": "gemma-3-27b"})  # with windows
FLAGS = COMMAND.flags


def main(argv):
    """Both layouts at every context; a Markdown table."""
    del argv
    o = COMMAND.options()
    try:
        rows = compare_layouts(COMMAND.engine_value("model"), o.profile, list(o.context_lens),
                               num_requests=o.num_requests, max_tokens=o.max_tokens)
    except ValueError as err:  # a model without sliding windows
        raise app.UsageError(str(err)) from err
    COMMAND.out.write({"rows": rows}, layouts_table(rows))
