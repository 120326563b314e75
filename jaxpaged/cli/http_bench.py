"""The flags ``jaxpaged bench serving --backend=http`` and ``bench http-overhead`` share, and the HTTP run.

Both take `HTTP_OPTIONS` (the workload or trace, the request set, the arrivals and the server) plus
``--goodput``; the requests and the run are `jaxpaged.bench.online.http_run`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxpaged.bench.offline.serving_workload import ServingWorkload
from jaxpaged.bench.online.http_run import HttpDriver, RequestSet, http_requests, run_http_benchmark
from jaxpaged.bench.online.online_metrics import online_markdown_table, parse_goodput
from jaxpaged.cli.options import CommandFlags

HTTP_OPTIONS = (ServingWorkload, RequestSet, HttpDriver)


def define_http_flags(command: CommandFlags) -> None:
    """The two flags of an HTTP benchmark no options dataclass holds: ``--goodput`` and ``--num_prompts``."""
    command.flags.DEFINE_multi_string("goodput", [], "SLOs in ms, e.g. --goodput=ttft:200,tpot:50 (or repeated)")
    command.flags.DEFINE_alias("num_prompts", "num_requests")


def command_requests(command: CommandFlags, workload: str):
    """`http_requests` of the command's parsed options (text measured with ``--tokenizer``, else ``--model``'s)."""
    return http_requests(*(command.options(t) for t in HTTP_OPTIONS), workload, command.engine_value("model"))


def run_http(command: CommandFlags, workload: str, *, extra_args: Sequence[str] = (), progress: bool = True) -> None:
    """Run the HTTP benchmark the flags describe against ``--base_url``; print and write the result.

    ``extra_args`` are leftover positional arguments, so ``--goodput ttft:1 tpot:2`` works.
    """
    goodput = command.flags["goodput"].value
    if extra_args and not goodput:
        raise ValueError(f"unexpected arguments {list(extra_args)}")
    slos = parse_goodput([*goodput, *extra_args])
    requests, offsets = command_requests(command, workload)
    run = run_http_benchmark(command.options(HttpDriver), requests, offsets, goodput_slos=slos, progress=progress)
    dataset = "trace" if command.options(ServingWorkload).trace else command.options(RequestSet).dataset_name
    result = {"model": run["model"], "dataset_name": dataset, "num_requests": len(requests),
              "goodput_slos_ms": slos} | run
    command.out.write(result, online_markdown_table({"http": run["metrics"]}))
