"""Serving benchmark: prefix caching on vs off vs a contiguous-KV baseline, side by side.

    jaxpaged bench serving --model=small --workload=chatbot --num_requests=16 \
        --json_out=out/bench_serving.json --md_out=out/bench_serving.md

With ``--backend=http`` it drives a running server (jaxpaged serve) over
async HTTP instead, as ``vllm bench serve`` does (jaxpaged/cli/http_bench.py):

    jaxpaged bench serving --backend=http --base_url=http://127.0.0.1:8000 \
        --dataset_name=random --num_prompts=32 --request_rate=4 --goodput=ttft:500,tpot:100

With ``--trace`` (a Mooncake-format JSONL trace) the requests and their arrivals
come from the trace, offline and over HTTP alike (timestamps times ``--trace_time_scale``; prompts longer than
``--max_model_len`` keep their shared head), instead of ``--workload``:

    jaxpaged bench serving --model=small --trace=data/traces/mooncake_conversation_trace.jsonl \
        --trace_limit=32 --trace_time_scale=0.01 --max_model_len=1024 --eviction_policy=slru

Latencies and throughput exclude compile time (reported separately); see
jaxpaged/bench/ for the driver and docs/BENCHMARKS.md for measured tables.
"""

from __future__ import annotations

import dataclasses
import logging

from jaxpaged.bench.offline.serving import MODES
from jaxpaged.bench.offline.serving import serve_modes, serving_tables
from jaxpaged.checkpoint import load_model
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.http_bench import HttpBenchFlags
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.cli.workload_flags import WorkloadFlags
from jaxpaged.sim.workloads import WORKLOADS

FLAGS = FlagSet()
bench_flags = WorkloadFlags(FLAGS)
online = HttpBenchFlags(FLAGS, bench_flags)
BACKEND = FLAGS.DEFINE_enum("backend", "offline", ["offline", "http"],
                            "offline: compare KV modes in-process; http: drive the server at --base_url")
WORKLOAD = FLAGS.DEFINE_enum("workload", "chatbot", list(WORKLOADS), "workload to serve")
MODES_FLAG = FLAGS.DEFINE_list("modes", list(MODES), "modes to compare")
ENGINE = EngineFlags(FLAGS, ["block_size", "eviction_policy", "kv_cache_metrics_sample"],
                     defaults={"kv_cache_metrics_sample": 0.01})
BLOCK_SIZE = ENGINE.holders["block_size"]
REPEATS = FLAGS.DEFINE_integer("repeats", 1, "interleaved repeats per mode; medians reported")
OUT = OutputFlags(FLAGS)
METRICS_PORT = FLAGS.DEFINE_integer("metrics_port", None, "serve Prometheus metrics of the running engine here")
LOG_INTERVAL = FLAGS.DEFINE_float("log_interval_s", None, "log a one-line engine summary this often")
PROGRESS = FLAGS.DEFINE_boolean("progress", True, "show a progress bar")

FLAGS.positive("repeats")
FLAGS.list_of("modes", choices=list(MODES))
FLAGS.at_least(1, "metrics_port")
FLAGS.register_validator("metrics_port", lambda v: v is None or v <= 65535, "--metrics_port must be <= 65535")
FLAGS.at_least(1e-3, "log_interval_s")


def main(argv):
    """Build the workload, run every mode (or drive the server), print and write the results."""
    if BACKEND.value == "http":
        online.run_from_flags(WORKLOAD.value, OUT, extra_args=argv[1:], progress=PROGRESS.value)
        return
    logging.getLogger("jaxpaged").setLevel(logging.INFO)
    bench_flags.enable_compile_cache()
    if bench_flags.TRACE.value:
        requests = bench_flags.trace_from_flags()
    else:
        requests = bench_flags.workload_from_flags(WORKLOAD.value)
    setup = dataclasses.replace(bench_flags.setup_from_flags(BLOCK_SIZE.value, requests),
                                eviction_policy=ENGINE.holders["eviction_policy"].value,
                                kv_cache_metrics_sample=ENGINE.holders["kv_cache_metrics_sample"].value)
    result = serve_modes(load_model(bench_flags.MODEL.value), setup, requests, modes=MODES_FLAG.value,
                         repeats=REPEATS.value, metrics_port=METRICS_PORT.value, log_interval_s=LOG_INTERVAL.value,
                         progress=PROGRESS.value, model_name=bench_flags.MODEL.value)
    meta = {"model": bench_flags.MODEL.value, "workload": bench_flags.TRACE.value or WORKLOAD.value,
            "num_requests": len(requests), "request_rate": bench_flags.REQUEST_RATE.value,
            "setup": dataclasses.asdict(setup), "repeats": REPEATS.value}
    OUT.write(meta | result, serving_tables(result))
