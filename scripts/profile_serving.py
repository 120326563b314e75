"""Profile a short serving workload: a TensorBoard / XProf / Perfetto trace and the host share.

    python scripts/profile_serving.py --model=small --workload=chatbot --num_requests=8 --trace_dir=traces/chatbot

Open the trace with `tensorboard --logdir traces/` (profile plugin) or load the
`.trace.json.gz` under `plugins/profile/*/` into https://ui.perfetto.dev. The
host spans "schedule", "prepare_inputs", "layout_inputs", "process_samples"
sit between the device steps ("device_step" and the XLA executions).
"""

from __future__ import annotations

import json

from absl import app, flags

from jaxpaged.cli import flag_checks
from jaxpaged.cli import workload_flags as bench_flags
from jaxpaged.bench.offline.profiling import profile_workload
from jaxpaged.bench.offline.serving import engine_config, make_runner
from jaxpaged.checkpoint import load_model
from jaxpaged.engine import Engine
from jaxpaged.workloads import WORKLOADS

WORKLOAD = flags.DEFINE_enum("workload", "chatbot", list(WORKLOADS), "workload to profile")
MODE = flags.DEFINE_enum("mode", "prefix_on", ["prefix_on", "prefix_off", "contiguous"], "KV mode")
BLOCK_SIZE = flags.DEFINE_integer("block_size", 16, "tokens per KV block")
TRACE_DIR = flags.DEFINE_string("trace_dir", "traces/profile", "where the trace goes ('' = no trace)")
JSON_OUT = flags.DEFINE_string("json_out", None, "write the timing summary here as JSON")

flag_checks.positive("block_size")


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
                              requests, TRACE_DIR.value)
    result["trace_dir"] = TRACE_DIR.value
    print(f"steps: {result['num_steps']}, step time {result['step_s']:.3f} s = device {result['device_s']:.3f} s "
          f"+ host {result['host_s']:.3f} s; host share {result['host_share']:.1%} "
          f"({result['host_ms_per_step']:.2f} ms host per step); compile time excluded: {result['compile_s']:.1f} s")
    if TRACE_DIR.value:
        print(f"trace written under {TRACE_DIR.value}")
    if JSON_OUT.value:
        with open(JSON_OUT.value, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    app.run(main)
