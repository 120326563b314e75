"""The flags ``jaxpaged bench serving --backend=http`` and ``bench http-overhead`` share: `HTTP_OPTIONS` (the
workload or trace, the request set, the arrivals and the server) plus ``--goodput`` and ``--num_prompts``; the
requests are `jaxpaged.bench.online.http_run`'s."""

from __future__ import annotations

from jaxpaged.bench.offline.serving_workload import ServingWorkload
from jaxpaged.bench.online.http_run import HttpDriver, RequestSet, http_requests
from jaxpaged.cli.options import CommandFlags

HTTP_OPTIONS = (ServingWorkload, RequestSet, HttpDriver)


def define_http_flags(command: CommandFlags) -> None:
    """The two flags of an HTTP benchmark no options dataclass holds: ``--goodput`` and ``--num_prompts``."""
    command.flags.DEFINE_multi_string("goodput", [], "SLOs in ms, e.g. --goodput=ttft:200,tpot:50 (or repeated)")
    command.flags.DEFINE_alias("num_prompts", "num_requests")


def command_requests(command: CommandFlags, workload: str):
    """`http_requests` of the command's parsed options (text measured with ``--tokenizer``, else ``--model``'s)."""
    return http_requests(*(command.options(t) for t in HTTP_OPTIONS), workload, command.engine_value("model"))
