"""``jaxpaged bench http-overhead``: one request set offline (engine in-process) and over HTTP, side by side.

Offline, `offline_results` turns each finished request's engine timings into the `RequestResult` the HTTP
client records, so the difference between the sides is what the HTTP layer costs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence

import httpx
import numpy as np

from jaxpaged.bench.offline.driver import median_summary, run_workload
from jaxpaged.bench.offline.serving import ServingSetup, engine_config
from jaxpaged.bench.offline.timing import alternate
from jaxpaged.bench.online.datasets import BenchRequest
from jaxpaged.bench.online.http_run import HttpDriver
from jaxpaged.bench.online.online_client import RequestResult, fetch_model_name, run_requests
from jaxpaged.bench.online.online_metrics import ROWS, compute_metrics
from jaxpaged.bench.online.server_process import ServerProcess
from jaxpaged.bench.options import option
from jaxpaged.outputs import RequestOutput
from jaxpaged.report import markdown_table
from jaxpaged.sim.workloads import WORKLOADS, WorkloadRequest


@dataclasses.dataclass(frozen=True)
class HttpOverheadOptions:
    """The workload, the rounds, and the server compared with the offline engine."""

    workload: str = option("chatbot", "workload for --dataset_name=workload", choices=list(WORKLOADS))
    repeats: int = option(3, "timed runs per side, interleaved; medians reported", at_least=1)
    warmup_runs: int = option(1, "untimed runs per side first (they compile the step shapes)", at_least=0)
    start_server: bool = option(True, "start jaxpaged serve with the offline engine's settings; false: use the "
                                      "server at --base_url, which must run with the settings this script prints")


def serve_args(model: str, setup: ServingSetup, extra: Sequence[str] = ()) -> list[str]:
    """``jaxpaged serve`` flags for the engine ``setup`` describes, then ``extra``."""
    return [f"--model={model}", f"--block_size={setup.block_size}",
            f"--kv_budget_tokens={setup.num_blocks * setup.block_size}", f"--max_model_len={setup.max_model_len}",
            f"--max_num_seqs={setup.max_num_seqs}", f"--max_num_batched_tokens={setup.max_num_batched_tokens}",
            *extra]


def offline_vs_http(model: str, setup: ServingSetup, requests: Sequence[BenchRequest], offsets: Sequence[float],
                    options: HttpOverheadOptions, driver: HttpDriver, *, server_args: Sequence[str],
                    env: dict[str, str] | None = None) -> dict:
    """Run ``requests`` offline and over HTTP alternately; `compare_offline_http`'s result plus
    ``offline_compiles_per_run`` (warm-up runs first).

    ``options.start_server``: a ``jaxpaged serve`` with ``server_args`` on a free port; else the server at
    ``driver.base_url``, which must run with those settings.
    """
    from jaxpaged.checkpoint import load_model
    from jaxpaged.engine import Engine
    engine = Engine(engine_config(setup, "prefix_on", model), load_model(model))
    with ServerProcess(server_args, env=env) if options.start_server else contextlib.nullcontext() as server:
        url = server.base_url if server is not None else driver.base_url
        served = fetch_model_name(url)
        offline_compiles: list[int] = []

        def run_offline():
            engine.reset_prefix_cache()
            compiles = engine.num_compiles
            outcome = offline_results(engine, requests, offsets)
            offline_compiles.append(engine.num_compiles - compiles)
            return outcome

        def run_http():
            httpx.post(f"{url}/reset_prefix_cache", timeout=30, trust_env=False).raise_for_status()
            return run_requests(url, served, requests, offsets, ignore_eos=driver.ignore_eos,
                                timeout_s=driver.request_timeout_s)

        result = compare_offline_http(run_offline, run_http, compute_metrics, repeats=options.repeats,
                                      warmup_runs=options.warmup_runs)
    print("offline compiles per run (warm-up runs first):", offline_compiles)
    return result | {"offline_compiles_per_run": offline_compiles}


def result_from_output(output: RequestOutput) -> RequestResult:
    """A finished engine output as the HTTP client would have recorded it (times from arrival)."""
    m = output.metrics
    completion = output.outputs[0]
    last_token = m.token_times[-1] if m.token_times else m.finish_time
    return RequestResult(output.request_id, success=completion.finish_reason != "abort",
                         prompt_len=len(output.prompt_token_ids), output_tokens=len(completion.token_ids),
                         cached_tokens=output.num_cached_tokens, start_time=m.arrival_time,
                         ttft=m.ttft if m.ttft is not None else 0.0, itl=m.inter_token_latencies,
                         latency=last_token - m.arrival_time, text=completion.text,
                         finish_reason=completion.finish_reason)


def offline_results(engine, requests: Sequence[BenchRequest], offsets: Sequence[float]
                    ) -> tuple[list[RequestResult], float]:
    """Run ``requests`` (sent at ``offsets``; text tokenized by the engine's tokenizer) through ``engine``, greedy
    with ``ignore_eos`` as the HTTP benchmark sends them; results in request order and the duration."""
    if len(offsets) != len(requests):
        raise ValueError(f"{len(offsets)} arrival offsets for {len(requests)} requests")
    workload = []
    for r, offset in zip(requests, offsets):
        prompt = engine.tokenizer.encode(r.prompt) if isinstance(r.prompt, str) else list(r.prompt)
        workload.append(WorkloadRequest(r.request_id, prompt, r.output_len, cache_salt=r.cache_salt,
                                        arrival_time=float(offset)))
    record = run_workload(engine, workload)
    by_id = {out.request_id: result_from_output(out) for out in record.outputs}
    return [by_id[r.request_id] for r in requests], record.end - record.start


def http_cost(offline: Mapping[str, float], http: Mapping[str, float]) -> dict[str, float]:
    """``http - offline`` for every latency (ms) and ``http / offline`` for every throughput."""
    cost = {}
    for key in offline:
        if key.endswith("_ms"):
            cost[key] = http[key] - offline[key]
        elif key.endswith("throughput"):
            cost[key] = http[key] / offline[key] if offline[key] else float("nan")
    return cost


def comparison_table(offline: Mapping[str, float], http: Mapping[str, float]) -> str:
    """A Markdown table: offline, HTTP, and HTTP - offline (latencies) or HTTP / offline (throughputs)."""
    cost = http_cost(offline, http)
    rows = []
    for label, key, fmt in ROWS:
        if key not in offline or not (np.isfinite(offline[key]) or np.isfinite(http[key])):
            continue
        delta = "" if key not in cost else f"x{cost[key]:.3f}" if key.endswith("throughput") else f"{cost[key]:+.1f}"
        rows.append([label, fmt.format(offline[key]), fmt.format(http[key]), delta])
    return markdown_table(["metric", "offline", "HTTP", "HTTP - offline"], rows)


def compare_offline_http(run_offline: Callable[[], tuple[list[RequestResult], float]],
                         run_http: Callable[[], tuple[list[RequestResult], float]],
                         summarize: Callable[[list[RequestResult], float], dict[str, float]], *,
                         repeats: int = 3, warmup_runs: int = 1) -> dict:
    """Run both sides ``repeats`` times, interleaved, after ``warmup_runs`` untimed runs each (compiles)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    runs = alternate({"offline": run_offline, "http": run_http}, repeats, warmup=warmup_runs)
    runs = {side: [summarize(*run) for run in side_runs] for side, side_runs in runs.items()}
    medians = {side: median_summary(r) for side, r in runs.items()}
    return {"runs": runs, "median": medians, "http_cost": http_cost(medians["offline"], medians["http"])}
