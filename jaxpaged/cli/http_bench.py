"""The request set and the HTTP run of ``jaxpaged bench serving --backend=http`` and ``bench http-overhead``.

Both commands take `HTTP_OPTIONS` (the workload or trace, the request set
``--dataset_name``, the arrival process ``--request_rate`` / ``--burstiness``,
``--max_concurrency``) plus ``--goodput``; `run_http` sends the requests
(`jaxpaged.bench.online.http_run`) and writes JSON and Markdown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxpaged.bench.offline.serving_workload import ServingWorkload
from jaxpaged.bench.online.arrivals import arrival_offsets
from jaxpaged.bench.online.datasets import BenchRequest
from jaxpaged.bench.online.http_run import HttpDriver, RequestSet, run_http_benchmark
from jaxpaged.bench.online.online_client import fetch_model_name
from jaxpaged.bench.online.online_metrics import parse_goodput
from jaxpaged.cli.options import CommandFlags

HTTP_OPTIONS = (ServingWorkload, RequestSet, HttpDriver)


def define_http_flags(command: CommandFlags) -> None:
    """The two flags of an HTTP benchmark no options dataclass holds: ``--goodput`` and ``--num_prompts``."""
    command.flags.DEFINE_multi_string("goodput", [], "SLOs in ms, e.g. --goodput=ttft:200,tpot:50 (or repeated)")
    command.flags.DEFINE_alias("num_prompts", "num_requests")


def http_requests(command: CommandFlags, workload: str) -> tuple[list[BenchRequest], list[float]]:
    """The requests and their arrival offsets (seconds): ``--trace`` at its own (time-scaled) arrivals, else the
    jaxpaged workload ``workload`` (``--dataset_name=workload``) or the dataset at ``--request_rate`` and
    ``--burstiness``; text is measured with ``--tokenizer``, else ``--model``'s."""
    wl, driver = command.options(ServingWorkload), command.options(HttpDriver)
    request_set = command.options(RequestSet, num_requests=wl.num_requests, seed=wl.seed,
                                  max_total_len=wl.max_model_len or 2048)
    request_set = dataclasses.replace(request_set, tokenizer=request_set.tokenizer or command.engine_value("model"))
    if wl.trace:
        trace = wl.trace_requests()
        return request_set.build(trace), [r.arrival_time for r in trace]
    requests = request_set.build(wl.workload(workload) if request_set.dataset_name == "workload" else None)
    offsets = arrival_offsets(len(requests), wl.request_rate, burstiness=driver.burstiness, seed=wl.seed)
    return requests, offsets.tolist()


def run_http(command: CommandFlags, workload: str, *, extra_args: Sequence[str] = (), progress: bool = True) -> dict:
    """Run the HTTP benchmark the flags describe against ``--base_url``; print, write and return the result.

    ``extra_args`` are leftover positional arguments, so ``--goodput ttft:1 tpot:2`` works.
    """
    goodput = command.flags["goodput"].value
    if extra_args and not goodput:
        raise ValueError(f"unexpected arguments {list(extra_args)}")
    slos = parse_goodput([*goodput, *extra_args])
    wl, driver, dataset = command.options(ServingWorkload), command.options(HttpDriver), command.options(RequestSet)
    model = driver.served_model_name or fetch_model_name(driver.base_url)
    requests, offsets = http_requests(command, workload)
    run = run_http_benchmark(driver.base_url, model, requests, offsets, goodput_slos=slos,
                             max_concurrency=driver.max_concurrency, ignore_eos=driver.ignore_eos,
                             timeout_s=driver.request_timeout_s, progress=progress)
    result = {"model": model, "dataset_name": "trace" if wl.trace else dataset.dataset_name,
              "num_requests": len(requests), "goodput_slos_ms": slos} | run.report()
    command.out.write(result, run.table())
    return result
