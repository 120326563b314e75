"""The simulated-H200 server in one process vs the engine core split off vs two API servers, side by side.

    jaxpaged bench engine-core --model=llama3-8b --concurrency=64,256,512 --random_output_len=256 \
        --json_out=out/bench_engine_core.json --md_out=out/bench_engine_core.md

At each concurrency, that many streaming clients each send one random prompt to a ``jaxpaged serve
--device=simulated`` of each configuration: tok/s, device busy, TPOT/ITL, CPU per streamed token of every
process, the core's host time per decode step; ``--host_overhead_seqs`` adds that host time measured alone.
docs/benchmarks/engine-core.md.
"""

from __future__ import annotations

from jaxpaged.bench.online.engine_core import EngineCoreBench, engine_core_table, host_overhead_rows, run_configs
from jaxpaged.cli.options import CommandFlags

# only what the run reads: it starts its own servers (their limits are the run's, see EngineCoreBench)
COMMAND = CommandFlags(EngineCoreBench, engine=["model"], engine_defaults={"model": "small"})
FLAGS = COMMAND.flags


def main(argv):
    """Run every configuration at every concurrency; print and write the table."""
    del argv
    bench = COMMAND.options(model=COMMAND.engine_value("model"))
    rows, host_rows = run_configs(bench), host_overhead_rows(bench)
    COMMAND.out.write({"rows": rows, "host_overhead": host_rows}, engine_core_table(rows, host_rows))
