"""Serving benchmark: prefix caching on vs off vs a contiguous-KV baseline, side by side; or a live server.

    jaxpaged bench serving --model=small --workload=chatbot --num_requests=16 --md_out=out/bench_serving.md
    jaxpaged bench serving --backend=http --base_url=http://127.0.0.1:8000 --dataset_name=random --num_prompts=32

``--backend=http`` drives a running ``jaxpaged serve`` as ``vllm bench serve`` does; ``--trace`` serves a
Mooncake-format JSONL trace instead of ``--workload``. Latencies and throughput exclude compile time.
docs/benchmarks/serving.md; the trace: docs/cache.md, "Traces".
"""

from __future__ import annotations

import dataclasses
import logging

from jaxpaged import compile_cache
from jaxpaged.bench.offline.serving import MODES, serve_modes, serving_tables
from jaxpaged.bench.offline.serving_workload import SERVING_ENGINE_FIELDS, ServingWorkload
from jaxpaged.bench.online.http_run import HttpDriver, RequestSet, run_http_benchmark
from jaxpaged.bench.online.online_metrics import online_markdown_table, parse_goodput
from jaxpaged.bench.options import option
from jaxpaged.checkpoint import load_model
from jaxpaged.cli.http_bench import HTTP_OPTIONS, command_requests, define_http_flags
from jaxpaged.cli.options import CommandFlags
from jaxpaged.sim.workloads import WORKLOADS, max_context_len


@dataclasses.dataclass(frozen=True)
class ServingOptions:
    """Offline or over HTTP, the workload, the modes compared, and what runs beside them."""

    backend: str = option("offline", "offline: compare KV modes in-process; http: drive the server at --base_url",
                          choices=["offline", "http"])
    workload: str = option("chatbot", "workload to serve", choices=list(WORKLOADS))
    modes: tuple[str, ...] = option(tuple(MODES), "modes to compare", choices=list(MODES))
    repeats: int = option(1, "interleaved repeats per mode; medians reported", at_least=1)
    metrics_port: int | None = option(None, "serve Prometheus metrics of the running engine here", check="port")
    log_interval_s: float | None = option(None, "log a one-line engine summary this often", at_least=1e-3)
    progress: bool = option(True, "show a progress bar")


COMMAND = CommandFlags(ServingOptions, *HTTP_OPTIONS,
                       engine=[*SERVING_ENGINE_FIELDS, "eviction_policy", "kv_cache_metrics_sample"],
                       engine_defaults={"model": "small", "kv_cache_metrics_sample": 0.01})
FLAGS = COMMAND.flags
define_http_flags(COMMAND)


def main(argv):
    """Build the workload, run every mode (or drive the server), print and write the results."""
    options, workload = COMMAND.options(), COMMAND.options(ServingWorkload)
    if options.backend == "http":
        serve_http(options, argv[1:])
        return
    logging.getLogger("jaxpaged").setLevel(logging.INFO)
    engine = COMMAND.engine.kwargs()
    compile_cache.configure(engine["compile_cache_dir"])
    requests = workload.requests(options.workload)
    setup = workload.setup(engine, max_context_len(requests))
    result = serve_modes(load_model(engine["model"]), setup, requests, modes=list(options.modes),
                         repeats=options.repeats, metrics_port=options.metrics_port,
                         log_interval_s=options.log_interval_s, progress=options.progress, model_name=engine["model"])
    meta = {"num_requests": len(requests), "setup": dataclasses.asdict(setup)}
    COMMAND.out.write(meta | result, serving_tables(result))


def serve_http(options: ServingOptions, extra_args: list[str]) -> None:
    """--backend=http against ``--base_url``; ``extra_args`` (leftover positional arguments) are SLOs, so
    ``--goodput ttft:1 tpot:2`` works."""
    goodput = FLAGS["goodput"].value
    if extra_args and not goodput:
        raise ValueError(f"unexpected arguments {list(extra_args)}")
    slos = parse_goodput([*goodput, *extra_args])
    requests, offsets = command_requests(COMMAND, options.workload)
    run = run_http_benchmark(COMMAND.options(HttpDriver), requests, offsets, goodput_slos=slos,
                             progress=options.progress)
    dataset = "trace" if COMMAND.options(ServingWorkload).trace else COMMAND.options(RequestSet).dataset_name
    result = {"model": run["model"], "dataset_name": dataset, "num_requests": len(requests),
              "goodput_slos_ms": slos} | run
    COMMAND.out.write(result, online_markdown_table({"http": run["metrics"]}))
