"""Profile a short serving workload: a TensorBoard / XProf / Perfetto trace and the host share.

    jaxpaged bench profile --model=small --workload=chatbot --num_requests=8 --trace_dir=traces/chatbot

Open the trace with `tensorboard --logdir traces/` (profile plugin) or load the
`.trace.json.gz` under `plugins/profile/*/` into https://ui.perfetto.dev. The
host spans "schedule", "prepare_inputs", "layout_inputs", "process_samples"
sit between the device steps ("device_step" and the XLA executions).
"""

from __future__ import annotations

from jaxpaged.bench.offline.profiling import profile_serving
from jaxpaged.checkpoint import load_model
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.cli.workload_flags import WorkloadFlags
from jaxpaged.sim.workloads import WORKLOADS

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
    OUT.write(profile_serving(load_model(bench_flags.MODEL.value), setup, MODE.value, requests, TRACE_DIR.value))
