"""The same request set run offline (the engine in-process) and over HTTP, measured alike.

Offline, :func:`offline_results` drives an :class:`Engine` through the
requests at their arrival offsets (jaxpaged/bench/offline/driver.py) and turns each
finished request's engine timings into the :class:`RequestResult` the HTTP
client records: TTFT from the scheduled arrival to the first token, ITL
between consecutive tokens, end-to-end latency to the last token. Over HTTP,
the same requests go to a server with the same engine configuration. The
difference between the two is what the HTTP layer (request parsing, the
engine loop's queue, streamed DELTA outputs and detokenization, SSE, the
client) costs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from jaxpaged.bench.offline.driver import run_workload
from jaxpaged.bench.offline.timing import alternate
from jaxpaged.bench.online.datasets import BenchRequest
from jaxpaged.bench.online.online_client import RequestResult
from jaxpaged.bench.online.online_metrics import ROWS
from jaxpaged.outputs import RequestOutput
from jaxpaged.report import markdown_table
from jaxpaged.sim.workloads import WorkloadRequest


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
    """Run ``requests`` (sent at ``offsets``) through ``engine``; results in request order and the duration.

    Text prompts are tokenized by the engine's tokenizer first. Every request
    is greedy with ``ignore_eos``, as the HTTP benchmark sends them.
    """
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


def median_metrics(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per-key median over repeated runs (NaN where every run has NaN)."""
    return {key: float(np.nanmedian([run[key] for run in runs])) if any(np.isfinite([run[key] for run in runs]))
            else float("nan") for key in runs[0]}


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
        if key in cost:
            delta = f"x{cost[key]:.3f}" if key.endswith("throughput") else f"{cost[key]:+.1f}"
        else:
            delta = ""
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
    medians = {side: median_metrics(r) for side, r in runs.items()}
    return {"runs": runs, "median": medians, "http_cost": http_cost(medians["offline"], medians["http"])}
