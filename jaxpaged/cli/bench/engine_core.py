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

from jaxpaged.bench.online.engine_core import CONFIGS, EngineCoreBench, engine_core_table, host_overhead_rows, run_configs
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

# only what the run reads: it starts its own servers (their limits are the run's, see EngineCoreBench)
FLAGS = FlagSet()
MODEL = EngineFlags(FLAGS, ["model"], defaults={"model": "small"}).holders["model"]
INPUT_LEN = FLAGS.DEFINE_integer("random_input_len", 1024, "prompt tokens (random) of each client's one request")
OUTPUT_LEN = FLAGS.DEFINE_integer("random_output_len", 128, "generated tokens (ignore EOS) of each request")
CONCURRENCY = FLAGS.DEFINE_list("concurrency", ["64", "256", "512"], "streaming clients at once, one run each")
CONFIGS_FLAG = FLAGS.DEFINE_list("configs", list(CONFIGS),
                                 "thread: one process; process: the split; process2: split with two API servers")
PROFILE = FLAGS.DEFINE_string("device_profile", "h200-141gb", "the simulated device")
HOST_SEQS = FLAGS.DEFINE_list("host_overhead_seqs", None, "also time the core's host work per decode step alone "
                              "at these sequence counts (e.g. 64,256,512)")
HOST_REPEATS = FLAGS.DEFINE_integer("host_overhead_repeats", 3, "runs per --host_overhead_seqs count")
OUT = OutputFlags(FLAGS)
FLAGS.positive("random_input_len", "random_output_len")
FLAGS.list_of("concurrency", integer_at_least=1)
FLAGS.list_of("host_overhead_seqs", integer_at_least=1)
FLAGS.positive("host_overhead_repeats")
FLAGS.list_of("configs", choices=list(CONFIGS))
FLAGS.device_profile("device_profile")


def main(argv):
    """Run every configuration at every concurrency; print and write the table."""
    del argv
    bench = EngineCoreBench(model=MODEL.value, device_profile=PROFILE.value, input_len=INPUT_LEN.value,
                            output_len=OUTPUT_LEN.value, concurrencies=tuple(int(c) for c in CONCURRENCY.value),
                            configs=tuple(CONFIGS_FLAG.value))
    rows = run_configs(bench)
    host_rows = host_overhead_rows(bench.model, bench.device_profile, [int(n) for n in HOST_SEQS.value or []],
                                   HOST_REPEATS.value)
    OUT.write({"rows": rows, "host_overhead": host_rows}, engine_core_table(rows, host_rows))
