"""Profile a short serving workload: a TensorBoard / XProf / Perfetto trace and the host share.

    jaxpaged bench profile --model=small --workload=chatbot --num_requests=8 --trace_dir=traces/chatbot

Open the trace with `tensorboard --logdir traces/` (profile plugin) or load the
`.trace.json.gz` under `plugins/profile/*/` into https://ui.perfetto.dev. The
host spans "schedule", "prepare_inputs", "layout_inputs", "process_samples"
sit between the device steps ("device_step" and the XLA executions).
"""

from __future__ import annotations

import dataclasses

from jaxpaged import compile_cache
from jaxpaged.bench.offline.profiling import profile_serving
from jaxpaged.bench.offline.serving_workload import SERVING_ENGINE_FIELDS, ServingWorkload
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags
from jaxpaged.sim.workloads import WORKLOADS, max_context_len


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
    """The workload profiled, its KV mode, and where the trace goes."""

    workload: str = option("chatbot", "workload to profile", choices=list(WORKLOADS))
    mode: str = option("prefix_on", "KV mode", choices=["prefix_on", "prefix_off", "contiguous"])
    trace_dir: str = option("traces/profile", "where the trace goes ('' = no trace)")


COMMAND = CommandFlags(ProfileOptions, ServingWorkload, engine=SERVING_ENGINE_FIELDS,
                       engine_defaults={"model": "small"})
FLAGS = COMMAND.flags


def main(argv):
    """Warm up, trace one run, print the host share of step time."""
    del argv
    options, workload, engine = COMMAND.options(), COMMAND.options(ServingWorkload), COMMAND.engine.kwargs()
    compile_cache.configure(engine["compile_cache_dir"])
    requests = workload.workload(options.workload)
    setup = workload.setup(engine, max_context_len(requests))
    COMMAND.out.write(profile_serving(engine["model"], setup, options.mode, requests, options.trace_dir))
