"""Host time per engine step at GPU batch sizes, split into its parts, and the device-busy fraction.

    jaxpaged bench host-overhead --num_seqs=64,256,512 --json_out=out/host.json --md_out=out/host.md

The engine runs over a stand-in device whose steps take the cost model's predicted time on `--profile`.
Per batch size: host time per step with a device taking no time, split into schedule / input layout /
update / outputs, per `--output_kinds` entry; then the device-busy fraction with asynchronous scheduling
off and on. `--structured` puts every sequence under a grammar. See docs/benchmarks/host-overhead.md.
"""

from __future__ import annotations

from jaxpaged.bench.offline.host_overhead import HostOverheadSweep, host_overhead_tables, sweep_host_overhead
from jaxpaged.cli.options import CommandFlags

COMMAND = CommandFlags(HostOverheadSweep, engine=["model"],
                       engine_defaults={"model": "llama3-8b"})  # the model's shape only: no compute
FLAGS = COMMAND.flags


def main(argv):
    """Measure host time per step and device busy at every batch size; print and write the tables."""
    del argv
    sweep = COMMAND.options(model=COMMAND.engine_value("model"))
    runs = sweep_host_overhead(sweep)
    COMMAND.out.write({part: [vars(r) for done in by_key.values() for r in done] for part, by_key in runs.items()},
                      host_overhead_tables(runs, sweep))
