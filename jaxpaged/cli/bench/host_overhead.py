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

from jaxpaged.bench.offline.host_overhead import HostOverheadSweep, host_overhead_tables, sweep_host_overhead
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.outputs import RequestOutputKind

FLAGS = FlagSet()
NUM_SEQS = FLAGS.DEFINE_list("num_seqs", ["64", "256", "512"], "running decode sequences per step")
MODEL = EngineFlags(FLAGS, ["model"], defaults={"model": "llama3-8b"}).holders["model"]  # shape only: no compute
PROFILE = FLAGS.DEFINE_string("profile", "h200-141gb", "device profile whose step times the stand-in sleeps")
CONTEXT = FLAGS.DEFINE_integer("context_len", 1200, "mean context length (prompts span +-1/8 of it)")
STEPS = FLAGS.DEFINE_integer("steps", 64, "decode steps measured per run")
REPEATS = FLAGS.DEFINE_integer("repeats", 3, "runs per configuration (medians reported)")
OUTPUT_KINDS = FLAGS.DEFINE_list("output_kinds", ["delta", "final_only"],
                                 "output kinds for the host-time rows (delta: what a streaming server asks for)")
DETOKENIZE = FLAGS.DEFINE_bool("detokenize", False, "stream text too (the stand-in's token is one fixed id)")
STRUCTURED = FLAGS.DEFINE_bool("structured", False, "every sequence under a JSON-lines grammar over a synthetic "
                               "BPE vocabulary of the model's size: token masks filled and matchers advanced "
                               "each step")
OUT = OutputFlags(FLAGS)

FLAGS.device_profile("profile")
FLAGS.positive("context_len", "steps", "repeats")
FLAGS.list_of("num_seqs", integer_at_least=1)
FLAGS.list_of("output_kinds", choices=[k.name.lower() for k in RequestOutputKind])


def main(argv):
    """Measure host time per step and device busy at every batch size; print and write the tables."""
    del argv
    sweep = HostOverheadSweep(model=MODEL.value, profile=PROFILE.value, context_len=CONTEXT.value, steps=STEPS.value,
                              detokenize=DETOKENIZE.value, structured=STRUCTURED.value)
    runs = sweep_host_overhead(sweep, [int(n) for n in NUM_SEQS.value],
                               [RequestOutputKind[k.upper()] for k in OUTPUT_KINDS.value], REPEATS.value)
    OUT.write(runs.report(), host_overhead_tables(runs, sweep, REPEATS.value))
