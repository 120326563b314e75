"""Host time per engine step at GPU batch sizes, split into its parts, and the device-busy fraction.

    jaxpaged bench host-overhead --num_seqs=64,256,512 --json_out=out/host.json --md_out=out/host.md

The engine runs over a stand-in device (`jaxpaged.bench.offline.host_overhead`): the
real persistent batch and layout, steps that take the cost model's predicted
time on a device profile (llama3-8b on the H200 by default) in a worker
thread. Per batch size it reports (medians over `--repeats` runs, each the
median of `--steps` decode steps):

- host time per step with a device that takes no time, split into schedule /
  input layout / update from results / output processing, for each output
  kind in `--output_kinds`;
- the device-busy fraction when each step really takes its predicted time,
  asynchronous scheduling off and on.

`--structured` puts every sequence under a grammar (structured output): the
host then fills each step's token masks and advances the matchers too.

The work is `jaxpaged.bench.offline.host_overhead`.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.offline.host_overhead import HostOverheadSweep, host_overhead_tables, sweep_host_overhead
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags
from jaxpaged.outputs import RequestOutputKind


@dataclasses.dataclass(frozen=True)
class HostOverheadOptions:
    """The batch sizes and output kinds swept, and the runs per configuration."""

    num_seqs: tuple[int, ...] = option((64, 256, 512), "running decode sequences per step", at_least=1)
    output_kinds: tuple[str, ...] = option(("delta", "final_only"), "output kinds for the host-time rows (delta: "
                                                                    "what a streaming server asks for)",
                                           choices=[k.name.lower() for k in RequestOutputKind])
    repeats: int = option(3, "runs per configuration (medians reported)", at_least=1)


COMMAND = CommandFlags(HostOverheadOptions, HostOverheadSweep, engine=["model"],
                       engine_defaults={"model": "llama3-8b"})  # the model's shape only: no compute
FLAGS = COMMAND.flags


def main(argv):
    """Measure host time per step and device busy at every batch size; print and write the tables."""
    del argv
    o, sweep = COMMAND.options(), COMMAND.options(HostOverheadSweep, model=COMMAND.engine_value("model"))
    runs = sweep_host_overhead(sweep, list(o.num_seqs), [RequestOutputKind[k.upper()] for k in o.output_kinds],
                               o.repeats)
    COMMAND.out.write(runs.report(), host_overhead_tables(runs, sweep, o.repeats))
