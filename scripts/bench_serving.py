"""Serving benchmark: prefix caching on vs off vs a contiguous-KV baseline, side by side.

    python scripts/bench_serving.py --model=small --workload=chatbot --num_requests=16 \
        --json_out=out/bench_serving.json --md_out=out/bench_serving.md

With ``--backend=http`` it drives a running server (scripts/serve.py) over
async HTTP instead, as ``vllm bench serve`` does (jaxpaged/bench/online.py):

    python scripts/bench_serving.py --backend=http --base_url=http://127.0.0.1:8000 \
        --dataset_name=random --num_prompts=32 --request_rate=4 --goodput=ttft:500,tpot:100

Latencies and throughput exclude compile time (reported separately); see
jaxpaged/bench/ for the driver and docs/BENCHMARKS.md for measured tables.
"""

from __future__ import annotations

import dataclasses
import logging

from absl import app, flags
from tqdm.auto import tqdm

from jaxpaged.bench import flag_checks, online
from jaxpaged.bench import flags as bench_flags
from jaxpaged.bench.report import markdown_table
from jaxpaged.bench.results_io import write_outputs
from jaxpaged.bench.serving import MODES, compare_modes
from jaxpaged.checkpoint import load_model
from jaxpaged.metrics import attach_metrics
from jaxpaged.workloads import WORKLOADS

BACKEND = flags.DEFINE_enum("backend", "offline", ["offline", "http"],
                            "offline: compare KV modes in-process; http: drive the server at --base_url")
WORKLOAD = flags.DEFINE_enum("workload", "chatbot", list(WORKLOADS), "workload to serve")
MODES_FLAG = flags.DEFINE_list("modes", list(MODES), "modes to compare")
BLOCK_SIZE = flags.DEFINE_integer("block_size", 16, "tokens per KV block")
REPEATS = flags.DEFINE_integer("repeats", 1, "interleaved repeats per mode; medians reported")
JSON_OUT = flags.DEFINE_string("json_out", None, "write all results here as JSON")
MD_OUT = flags.DEFINE_string("md_out", None, "write the Markdown table here")
METRICS_PORT = flags.DEFINE_integer("metrics_port", None, "serve Prometheus metrics of the running engine here")
LOG_INTERVAL = flags.DEFINE_float("log_interval_s", None, "log a one-line engine summary this often")
PROGRESS = flags.DEFINE_boolean("progress", True, "show a progress bar")

flag_checks.positive("block_size", "repeats")
flag_checks.list_of("modes", choices=list(MODES))
flag_checks.at_least(1, "metrics_port")
flags.register_validator("metrics_port", lambda v: v is None or v <= 65535, "--metrics_port must be <= 65535")
flag_checks.at_least(1e-3, "log_interval_s")


def main(argv):
    """Build the workload, run every mode (or drive the server), print and write the results."""
    if BACKEND.value == "http":
        online.run_from_flags(WORKLOAD.value, extra_args=argv[1:], json_out=JSON_OUT.value, md_out=MD_OUT.value,
                              progress=PROGRESS.value)
        return
    logging.getLogger("jaxpaged").setLevel(logging.INFO)
    bench_flags.enable_compile_cache()
    requests = bench_flags.workload_from_flags(WORKLOAD.value)
    setup = bench_flags.setup_from_flags(BLOCK_SIZE.value, requests)
    model = load_model(bench_flags.MODEL.value)
    bar = tqdm(total=len(requests) * len(MODES_FLAG.value) * REPEATS.value, desc="requests",
               disable=not PROGRESS.value)
    port = iter([METRICS_PORT.value])  # the HTTP server can bind once; it serves the first engine's registry

    def hook(engine):
        attach_metrics(engine, port=next(port, None), log_interval_s=LOG_INTERVAL.value)

    result = compare_modes(model, setup, requests, modes=MODES_FLAG.value, repeats=REPEATS.value,
                           on_finish=lambda _: bar.update(), engine_hook=hook)
    bar.close()
    table = markdown_table(result["median"], result["ratios"])
    print(table)
    meta = {"model": bench_flags.MODEL.value, "workload": WORKLOAD.value, "num_requests": len(requests),
            "request_rate": bench_flags.REQUEST_RATE.value, "setup": dataclasses.asdict(setup), "repeats": REPEATS.value}
    write_outputs(meta | result, table, JSON_OUT.value, MD_OUT.value)


if __name__ == "__main__":
    app.run(main)
