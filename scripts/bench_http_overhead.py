"""What the HTTP layer costs: one request set offline (engine in-process) and over HTTP, side by side.

    python scripts/bench_http_overhead.py --model=tiny --dataset_name=random --num_prompts=16 \
        --random_input_len=64 --random_output_len=32 --request_rate=4 --repeats=3 \
        --json_out=out/http_overhead.json --md_out=out/http_overhead.md

Starts scripts/serve.py on a free loopback port with the same engine settings
as the offline engine (model, block size, KV budget, limits, prefix caching
on), warms both up with one untimed run, then alternates timed runs; both
sides reset their prefix cache before every run. Reports medians: offline,
HTTP, and HTTP - offline per latency (ms) or HTTP / offline per throughput.
The request set and arrivals come from the same flags as
``scripts/bench_serving.py --backend=http``.
"""

from __future__ import annotations

import contextlib
import logging

import httpx
from absl import app, flags

from jaxpaged.bench import flag_checks, online
from jaxpaged.bench import flags as bench_flags
from jaxpaged.bench.offline_online import (
    compare_offline_http,
    comparison_table,
    offline_results,
)
from jaxpaged.bench.online_client import fetch_model_name, run_requests
from jaxpaged.bench.online_metrics import compute_metrics
from jaxpaged.bench.results_io import write_outputs
from jaxpaged.bench.server_process import ServerProcess
from jaxpaged.bench.serving import ServingSetup, engine_config
from jaxpaged.checkpoint import load_model
from jaxpaged.engine import Engine
from jaxpaged.mathutils import cdiv
from jaxpaged.workloads import WORKLOADS

WORKLOAD = flags.DEFINE_enum("workload", "chatbot", list(WORKLOADS), "workload for --dataset_name=workload")
BLOCK_SIZE = flags.DEFINE_integer("block_size", 16, "tokens per KV block")
REPEATS = flags.DEFINE_integer("repeats", 3, "timed runs per side, interleaved; medians reported")
WARMUP = flags.DEFINE_integer("warmup_runs", 1, "untimed runs per side first (they compile the step shapes)")
START_SERVER = flags.DEFINE_boolean("start_server", True,
                                    "start serve.py with the offline engine's settings; false: use the server at "
                                    "--base_url, which must run with the settings this script prints")
SERVE_ARGS = flags.DEFINE_multi_string("serve_arg", [], "extra scripts/serve.py flag, e.g. --serve_arg=--foo=1")
flag_checks.positive("block_size", "repeats")
flag_checks.non_negative("warmup_runs")
JSON_OUT = flags.DEFINE_string("json_out", None, "write all results here as JSON")
MD_OUT = flags.DEFINE_string("md_out", None, "write the Markdown table here")


def main(argv):
    """Build the request set, run it offline and over HTTP alternately, print and write the comparison."""
    del argv
    logging.getLogger("jaxpaged").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if online.MAX_CONCURRENCY.value is not None:
        raise app.UsageError("--max_concurrency has no offline counterpart; use --request_rate")
    bench_flags.enable_compile_cache()
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
    env = {}
    if bench_flags.COMPILE_CACHE.value:  # the server shares the persistent compile cache (JAX reads these)
        env = {"JAX_COMPILATION_CACHE_DIR": bench_flags.COMPILE_CACHE.value,
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}

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
    print(table)
    meta = {"model": model_name, "dataset_name": online.DATASET.value, "num_requests": len(requests),
            "request_rate": bench_flags.REQUEST_RATE.value, "burstiness": online.BURSTINESS.value,
            "repeats": REPEATS.value, "warmup_runs": WARMUP.value, "setup": setup.__dict__,
            "serve_args": serve_args, "offline_compiles_per_run": offline_compiles}
    print("offline compiles per run (warm-up runs first):", offline_compiles)
    write_outputs(meta | result, table, JSON_OUT.value, MD_OUT.value)


if __name__ == "__main__":
    app.run(main)
