"""What the HTTP layer costs: one request set offline (engine in-process) and over HTTP, side by side.

    jaxpaged bench http-overhead --model=tiny --dataset_name=random --num_prompts=16 \
        --random_input_len=64 --random_output_len=32 --repeats=3 --md_out=out/http_overhead.md

Starts ``jaxpaged serve`` with the offline engine's settings, alternates timed runs after a warm-up, and
reports medians and HTTP - offline (latencies) or HTTP / offline (throughputs). The request set takes the
flags of ``bench serving --backend=http``. docs/benchmarks/serving.md, "Online serving over HTTP".
"""

from __future__ import annotations

import logging

from absl import app

from jaxpaged import compile_cache
from jaxpaged.bench.offline.serving_workload import SERVING_ENGINE_FIELDS, ServingWorkload
from jaxpaged.bench.online.http_overhead import HttpOverheadOptions, comparison_table, offline_vs_http, serve_args
from jaxpaged.bench.online.http_run import HttpDriver
from jaxpaged.cli.http_bench import HTTP_OPTIONS, command_requests, define_http_flags
from jaxpaged.cli.options import CommandFlags

COMMAND = CommandFlags(HttpOverheadOptions, *HTTP_OPTIONS, engine=SERVING_ENGINE_FIELDS,
                       engine_defaults={"model": "small"})
FLAGS = COMMAND.flags
define_http_flags(COMMAND)
SERVE_ARGS = FLAGS.DEFINE_multi_string("serve_arg", [], "extra jaxpaged serve flag, e.g. --serve_arg=--foo=1")


def main(argv):
    """Build the request set, run it offline and over HTTP alternately, print and write the comparison."""
    del argv
    logging.getLogger("jaxpaged").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    options, workload, driver = COMMAND.options(), COMMAND.options(ServingWorkload), COMMAND.options(HttpDriver)
    if driver.max_concurrency is not None:
        raise app.UsageError("--max_concurrency has no offline counterpart; use --request_rate")
    engine = COMMAND.engine.kwargs()
    cache_dir = compile_cache.configure(engine["compile_cache_dir"])
    requests, offsets = command_requests(COMMAND, options.workload)
    setup = workload.setup(engine, max(r.prompt_len + r.output_len for r in requests))
    args = serve_args(engine["model"], setup, SERVE_ARGS.value)
    print("server settings:", " ".join(args))
    result = offline_vs_http(engine["model"], setup, requests, offsets, options, driver, server_args=args,
                             env=compile_cache.child_env(cache_dir))
    meta = {"num_requests": len(requests), "setup": setup.__dict__, "serve_args": args}
    COMMAND.out.write(meta | result, comparison_table(result["median"]["offline"], result["median"]["http"]))
