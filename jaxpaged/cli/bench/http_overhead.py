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
``jaxpaged bench serving --backend=http``.
"""

from __future__ import annotations

import contextlib
import logging

import httpx
from absl import app

from jaxpaged import compile_cache
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.http_bench import HttpBenchFlags
from jaxpaged.cli.workload_flags import WorkloadFlags
from jaxpaged.bench.online.offline_online import (
    compare_offline_http,
    comparison_table,
    offline_results,
)
from jaxpaged.bench.offline.serving import ServingSetup, engine_config
from jaxpaged.bench.online.online_client import fetch_model_name, run_requests
from jaxpaged.bench.online.online_metrics import compute_metrics
from jaxpaged.bench.online.server_process import ServerProcess
from jaxpaged.checkpoint import load_model
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.engine import Engine
from jaxpaged.mathutils import cdiv
from jaxpaged.workloads import WORKLOADS

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
    block = BLOCK_SIZE.value
    longest = max(r.prompt_len + r.output_len for r in requests)
    setup = ServingSetup(num_blocks=bench_flags.KV_BUDGET.value // block, block_size=block,
                         max_model_len=bench_flags.MAX_MODEL_LEN.value or cdiv(longest, block) * block,
                         max_num_seqs=bench_flags.MAX_NUM_SEQS.value,
                         max_num_batched_tokens=bench_flags.MAX_BATCHED.value)
    engine = Engine(engine_config(setup, "prefix_on", model_name), load_model(model_name))
    serve_args = [f"--model={model_name}", f"--block_size={block}", f"--kv_budget_tokens={setup.num_blocks * block}",
                  f"--max_model_len={setup.max_model_len}", f"--max_num_seqs={setup.max_num_seqs}",
                  f"--max_num_batched_tokens={setup.max_num_batched_tokens}", *SERVE_ARGS.value]
    env = compile_cache.child_env(cache_dir)  # the server shares this process's cache, or is off too

    print("server settings:", " ".join(serve_args))
    with ServerProcess(serve_args, env=env) if START_SERVER.value else contextlib.nullcontext() as server:
        base_url = server.base_url if server is not None else online.BASE_URL.value
        model = fetch_model_name(base_url)
        offline_compiles: list[int] = []  # per offline run, warm-up runs first

        def run_offline():
            engine.reset_prefix_cache()
            compiles = engine.num_compiles
            outcome = offline_results(engine, requests, offsets)
            offline_compiles.append(engine.num_compiles - compiles)
            return outcome

        def run_http():
            httpx.post(f"{base_url}/reset_prefix_cache", timeout=30, trust_env=False).raise_for_status()
            return run_requests(base_url, model, requests, offsets, ignore_eos=online.IGNORE_EOS.value,
                                timeout_s=online.TIMEOUT.value)

        result = compare_offline_http(run_offline, run_http, compute_metrics, repeats=REPEATS.value,
                                      warmup_runs=WARMUP.value)
    table = comparison_table(result["median"]["offline"], result["median"]["http"])
    meta = {"model": model_name, "dataset_name": online.DATASET.value, "num_requests": len(requests),
            "request_rate": bench_flags.REQUEST_RATE.value, "burstiness": online.BURSTINESS.value,
            "repeats": REPEATS.value, "warmup_runs": WARMUP.value, "setup": setup.__dict__,
            "serve_args": serve_args, "offline_compiles_per_run": offline_compiles}
    print("offline compiles per run (warm-up runs first):", offline_compiles)
    OUT.write(meta | result, table)
