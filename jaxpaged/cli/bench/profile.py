"""Profile a short serving workload: a TensorBoard / XProf / Perfetto trace and the host share.

    jaxpaged bench profile --model=small --workload=chatbot --num_requests=8 --trace_dir=traces/chatbot

Open the trace with `tensorboard --logdir traces/` (profile plugin) or load the
`.trace.json.gz` under `plugins/profile/*/` into https://ui.perfetto.dev. The
host spans "schedule", "prepare_inputs", "layout_inputs", "process_samples"
sit between the device steps ("device_step" and the XLA executions).
"""

from __future__ import annotations


from jaxpaged.bench.offline.profiling import profile_workload
from jaxpaged.bench.offline.serving import engine_config, make_runner
from jaxpaged.checkpoint import load_model
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.cli.workload_flags import WorkloadFlags
from jaxpaged.engine import Engine
from jaxpaged.workloads import WORKLOADS

FLAGS = FlagSet()
bench_flags = WorkloadFlags(FLAGS)
WORKLOAD = FLAGS.DEFINE_enum("workload", "chatbot", list(WORKLOADS), "workload to profile")
MODE = FLAGS.DEFINE_enum("mode", "prefix_on", ["prefix_on", "prefix_off", "contiguous"], "KV mode")
BLOCK_SIZE = EngineFlags(FLAGS, ["block_size"]).holders["block_size"]
TRACE_DIR = FLAGS.DEFINE_string("trace_dir", "traces/profile", "where the trace goes ('' = no trace)")
OUT = OutputFlags(FLAGS)


def main(argv):
    """Warm up, trace one run, print the host share of step time."""
    del argv
    bench_flags.enable_compile_cache()
    requests = bench_flags.workload_from_flags(WORKLOAD.value)
    setup = bench_flags.setup_from_flags(BLOCK_SIZE.value, requests)
    model = load_model(bench_flags.MODEL.value)
    runner = make_runner(model, setup)
    config = engine_config(setup, MODE.value, model.config.name)
    result = profile_workload(lambda: Engine(config, model, runner=runner, clock=runner.clock),
                              requests, TRACE_DIR.value, runner=runner)
    result["trace_dir"] = TRACE_DIR.value
    print(f"steps: {result['num_steps']}, step time {result['step_s']:.3f} s = device {result['device_s']:.3f} s "
          f"+ host {result['host_s']:.3f} s; host share {result['host_share']:.1%} "
          f"({result['host_ms_per_step']:.2f} ms host per step); compile time excluded: {result['compile_s']:.1f} s")
    if TRACE_DIR.value:
        print(f"trace written under {TRACE_DIR.value}")
    OUT.write(result)
