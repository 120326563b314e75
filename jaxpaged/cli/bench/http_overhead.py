"""What the HTTP layer costs: one request set offline (engine in-process) and over HTTP, side by side.

    jaxpaged bench http-overhead --model=tiny --dataset_name=random --num_prompts=16 \
        --random_input_len=64 --random_output_len=32 --request_rate=4 --repeats=3 \
        --json_out=out/http_overhead.json --md_out=out/http_overhead.md

Starts jaxpaged serve on a free loopback port with the same engine settings
as the offline engine (model, block size, KV budget, limits, prefix caching
on), warms both up with one untimed run, then alternates timed runs; both
sides reset their prefix cache before every run. Reports medians: offline,
HTTP, and HTTP - offline per latency (ms) or HTTP / offline per throughput.
The request set and arrivals come from the same flags as
``jaxpaged bench serving --backend=http``. The work is
`jaxpaged.bench.online.http_overhead`.
"""

from __future__ import annotations

import logging

from absl import app

from jaxpaged import compile_cache
from jaxpaged.bench.online.http_overhead import comparison_table, http_overhead_setup, offline_vs_http, serve_args
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.http_bench import HttpBenchFlags
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.cli.workload_flags import WorkloadFlags
from jaxpaged.sim.workloads import WORKLOADS

FLAGS = FlagSet()
bench_flags = WorkloadFlags(FLAGS)
online = HttpBenchFlags(FLAGS, bench_flags)
WORKLOAD = FLAGS.DEFINE_enum("workload", "chatbot", list(WORKLOADS), "workload for --dataset_name=workload")
BLOCK_SIZE = EngineFlags(FLAGS, ["block_size"]).holders["block_size"]
REPEATS = FLAGS.DEFINE_integer("repeats", 3, "timed runs per side, interleaved; medians reported")
WARMUP = FLAGS.DEFINE_integer("warmup_runs", 1, "untimed runs per side first (they compile the step shapes)")
START_SERVER = FLAGS.DEFINE_boolean("start_server", True,
                                    "start jaxpaged serve with the offline engine's settings; false: use the server at "
                                    "--base_url, which must run with the settings this script prints")
SERVE_ARGS = FLAGS.DEFINE_multi_string("serve_arg", [], "extra jaxpaged serve flag, e.g. --serve_arg=--foo=1")
FLAGS.positive("repeats")
FLAGS.non_negative("warmup_runs")
OUT = OutputFlags(FLAGS)


def main(argv):
    """Build the request set, run it offline and over HTTP alternately, print and write the comparison."""
    del argv
    logging.getLogger("jaxpaged").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if online.MAX_CONCURRENCY.value is not None:
        raise app.UsageError("--max_concurrency has no offline counterpart; use --request_rate")
    cache_dir = bench_flags.enable_compile_cache()
    model_name = bench_flags.MODEL.value
    requests = online.requests_from_flags(WORKLOAD.value)
    offsets = online.offsets_from_flags(len(requests))
    setup = http_overhead_setup(requests, block_size=BLOCK_SIZE.value, kv_budget_tokens=bench_flags.KV_BUDGET.value,
                                max_model_len=bench_flags.MAX_MODEL_LEN.value,
                                max_num_seqs=bench_flags.MAX_NUM_SEQS.value,
                                max_num_batched_tokens=bench_flags.MAX_BATCHED.value)
    args = serve_args(model_name, setup, SERVE_ARGS.value)
    print("server settings:", " ".join(args))
    result = offline_vs_http(model_name, setup, requests, offsets, server_args=args, start_server=START_SERVER.value,
                             base_url=online.BASE_URL.value, env=compile_cache.child_env(cache_dir),
                             ignore_eos=online.IGNORE_EOS.value, timeout_s=online.TIMEOUT.value,
                             repeats=REPEATS.value, warmup_runs=WARMUP.value)
    compiles = result.pop("offline_compiles_per_run")
    meta = {"model": model_name, "dataset_name": online.DATASET.value, "num_requests": len(requests),
            "request_rate": bench_flags.REQUEST_RATE.value, "burstiness": online.BURSTINESS.value,
            "repeats": REPEATS.value, "warmup_runs": WARMUP.value, "setup": setup.__dict__,
            "serve_args": args, "offline_compiles_per_run": compiles}
    OUT.write(meta | result, comparison_table(result["median"]["offline"], result["median"]["http"]))
