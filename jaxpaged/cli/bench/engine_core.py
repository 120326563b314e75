"""The simulated-H200 server in one process vs the engine core split off vs two API servers, side by side.

    jaxpaged bench engine-core --model=llama3-8b --concurrency=64,256,512 --random_output_len=256 \
        --json_out=out/bench_engine_core.json --md_out=out/bench_engine_core.md

For each configuration (`--engine_core=thread`, `process`, `process` with
`--api_server_count=2`) one `jaxpaged serve --device=simulated --model=llama3-8b`
server is started; at each concurrency, that many streaming clients each send
one random `--random_input_len`-token prompt for `--random_output_len` tokens (ignore EOS).
Reported: output tok/s, the device-busy fraction, the rate a never-idle device
would give (tok/s / busy), TPOT and ITL p50/p99, CPU seconds per streamed
token of every server process (read from /proc: the engine core, each API
server) and of this load generator, and, split, the engine core's own host
time and loop-thread CPU time per decode step (its `engine_core_step_host_seconds`
and `engine_core_loop_cpu_seconds` metrics, means over the run's decode steps).

`--host_overhead_seqs` adds the engine core's host time per decode step
measured alone (`jaxpaged.bench.offline.host_overhead` with `engine_core=True`: the
core's output processing, stat logger and message encoding, no HTTP, no
sockets), with a device that takes no time and with the simulated H200's
steps, medians of `--host_overhead_repeats` runs of 64 steps.

The work is `jaxpaged.bench.online.engine_core`.
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
