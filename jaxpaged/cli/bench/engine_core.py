"""The simulated-H200 server in one process vs the engine core split off vs two API servers, side by side.

    jaxpaged bench engine-core --model=llama3-8b --concurrency=64,256,512 --random_output_len=256 \
        --json_out=out/bench_engine_core.json --md_out=out/bench_engine_core.md

At each concurrency, that many streaming clients each send one random prompt to a ``jaxpaged serve
--device=simulated`` of each configuration: tok/s, device busy, TPOT/ITL, CPU per streamed token of every
process, the core's host time per decode step; ``--host_overhead_seqs`` adds that host time measured alone.
docs/benchmarks/engine-core.md.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.online.engine_core import EngineCoreBench, engine_core_table, host_overhead_rows, run_configs
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags


@dataclasses.dataclass(frozen=True)
class HostOverheadOptions:
    """The core's host work per decode step, timed alone (optional)."""

    host_overhead_seqs: tuple[int, ...] = option((), "also time the core's host work per decode step alone at "
                                                     "these sequence counts (e.g. 64,256,512)", at_least=1)
    host_overhead_repeats: int = option(3, "runs per --host_overhead_seqs count", at_least=1)


# only what the run reads: it starts its own servers (their limits are the run's, see EngineCoreBench)
COMMAND = CommandFlags(EngineCoreBench, HostOverheadOptions, engine=["model"], engine_defaults={"model": "small"})
FLAGS = COMMAND.flags


def main(argv):
    """Run every configuration at every concurrency; print and write the table."""
    del argv
    bench, host = COMMAND.options(model=COMMAND.engine_value("model")), COMMAND.options(HostOverheadOptions)
    rows = run_configs(bench)
    host_rows = host_overhead_rows(bench.model, bench.device_profile, list(host.host_overhead_seqs),
                                   host.host_overhead_repeats)
    COMMAND.out.write({"rows": rows, "host_overhead": host_rows}, engine_core_table(rows, host_rows))
