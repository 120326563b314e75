"""Host time per engine step at GPU batch sizes, split into its parts, and the device-busy fraction.

    jaxpaged bench host-overhead --num_seqs=64,256,512 --json_out=out/host.json --md_out=out/host.md

The engine runs over a stand-in device (`jaxpaged.bench.simulator.host_overhead`): the
real persistent batch and layout, steps that take the cost model's predicted
time on a device profile (llama3-8b on the H200 by default) in a worker
thread. Per batch size it reports (medians over `--repeats` runs, each the
median of `--steps` decode steps):

- host time per step with a device that takes no time, split into schedule /
  input layout / update from results / output processing, for each output
  kind in `--output_kinds`;
- the device-busy fraction when each step really takes its predicted time,
  asynchronous scheduling off and on.
"""

from __future__ import annotations

import platform
import statistics


from jaxpaged.bench.output import markdown_table
from jaxpaged.bench.simulator.host_overhead import HostOverhead, measure_host_overhead
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.outputs import RequestOutputKind

FLAGS = FlagSet()
NUM_SEQS = FLAGS.DEFINE_list("num_seqs", ["64", "256", "512"], "running decode sequences per step")
MODEL = FLAGS.DEFINE_string("model", "llama3-8b", "model config (shape only: nothing is computed)")
PROFILE = FLAGS.DEFINE_string("profile", "h200-141gb", "device profile whose step times the stand-in sleeps")
CONTEXT = FLAGS.DEFINE_integer("context_len", 1200, "mean context length (prompts span +-1/8 of it)")
STEPS = FLAGS.DEFINE_integer("steps", 64, "decode steps measured per run")
REPEATS = FLAGS.DEFINE_integer("repeats", 3, "runs per configuration (medians reported)")
OUTPUT_KINDS = FLAGS.DEFINE_list("output_kinds", ["delta", "final_only"],
                                 "output kinds for the host-time rows (delta: what a streaming server asks for)")
DETOKENIZE = FLAGS.DEFINE_bool("detokenize", False, "stream text too (the stand-in's token is one fixed id)")
OUT = OutputFlags(FLAGS)

PARTS = ("schedule_ms", "layout_ms", "update_ms", "outputs_ms", "host_ms", "us_per_seq")

FLAGS.model_name("model")
FLAGS.device_profile("profile")
FLAGS.positive("context_len", "steps", "repeats")
FLAGS.list_of("num_seqs", integer_at_least=1)
FLAGS.list_of("output_kinds", choices=[k.name.lower() for k in RequestOutputKind])


def _median(runs: list[HostOverhead], field: str) -> float:
    return statistics.median(getattr(r, field) for r in runs)


def main(argv):
    """Measure host time per step and device busy at every batch size; print and write the tables."""
    del argv
    kinds = [RequestOutputKind[k.upper()] for k in OUTPUT_KINDS.value]
    common = dict(model=MODEL.value, profile=PROFILE.value, context_len=CONTEXT.value, steps=STEPS.value,
                  detokenize=DETOKENIZE.value)
    host: dict[tuple[int, str], list[HostOverhead]] = {}
    busy: dict[tuple[int, bool], list[HostOverhead]] = {}
    for repeat in range(REPEATS.value):  # interleaved: machine load drifts over every configuration alike
        for n in map(int, NUM_SEQS.value):
            for kind in kinds:
                run = measure_host_overhead(n, sleep=False, async_scheduling=True, output_kind=kind, seed=repeat,
                                            **common)
                host.setdefault((n, kind.name), []).append(run)
                print(f"{n} seqs, {kind.name}: host {run.host_ms:.3f} ms", flush=True)
            for async_scheduling in (False, True):
                run = measure_host_overhead(n, sleep=True, async_scheduling=async_scheduling,
                                            output_kind=kinds[0], seed=repeat, **common)
                busy.setdefault((n, async_scheduling), []).append(run)
                print(f"{n} seqs, async={async_scheduling}: device busy {run.device_busy:.3f}", flush=True)

    lines = [f"Host time per decode step (ms, medians of {REPEATS.value} runs x {STEPS.value} steps), "
             f"{MODEL.value} shape, ~{CONTEXT.value}-token contexts, device stand-in: {PROFILE.value}; "
             f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}",
             ""]
    host_rows = []
    for (n, kind), runs in host.items():
        values = [_median(runs, f) for f in PARTS]
        host_rows.append([n, kind, *(f"{v:.3f}" for v in values[:5]), f"{values[5]:.2f}"])
    lines.append(markdown_table(["seqs", "outputs", "schedule", "layout", "update", "outputs", "whole step (host)",
                                 "us / seq"], host_rows, align="rlrrrrrr"))
    lines += ["", "Device busy while each step takes its predicted time (the stand-in's worker thread sleeps it)", ""]
    busy_rows = [[n, f"{_median(runs, 'device_ms'):.2f}", "async" if async_scheduling else "sync",
                  f"{_median(runs, 'host_ms'):.3f}", f"{_median(runs, 'step_ms'):.2f}",
                  f"{_median(runs, 'device_busy'):.1%}"] for (n, async_scheduling), runs in busy.items()]
    lines.append(markdown_table(["seqs", "device ms / step", "scheduling", "host ms / step", "wall ms / step",
                                 "device busy"], busy_rows, align="rrlrrr"))
    OUT.write({"host": [vars(r) for runs in host.values() for r in runs],
               "busy": [vars(r) for runs in busy.values() for r in runs]}, "\n".join(lines))
