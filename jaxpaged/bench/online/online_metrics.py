"""The online benchmark's numbers, defined as ``vllm bench serve`` defines them (docs/benchmarks/serving.md,
"Online serving over HTTP"): throughputs over the run, TTFT, TPOT (``(E2EL - TTFT) / (output_tokens - 1)``),
ITL pooled over requests and E2EL, each as mean, std, median, p90 and p99 in ms (numpy's linear percentiles;
NaN when empty), and goodput: requests per second meeting every SLO (a one-token request's TPOT counts as 0).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from jaxpaged.bench.online.online_client import RequestResult
from jaxpaged.report import metrics_table


SLO_METRICS = ("ttft", "tpot", "e2el")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (90, 99)


def parse_goodput(specs: Iterable[str]) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` (items may also be comma- or space-separated) -> ``{"ttft": 200.0, ...}`` in ms."""
    slos: dict[str, float] = {}
    for item in (part for spec in specs for part in re.split(r"[\s,]+", spec) if part):
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"goodput SLO {item!r}: expected NAME:MS with NAME one of {', '.join(SLO_METRICS)}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"goodput SLO {item!r}: {value!r} is not a number of milliseconds") from None
        if not ms > 0 or math.isinf(ms):
            raise ValueError(f"goodput SLO {item!r}: milliseconds must be positive and finite")
        slos[name] = ms
    return slos


def latency_stats(seconds: Sequence[float], name: str) -> dict[str, float]:
    """``{name}_{mean,std,median,p90,p99}_ms`` of ``seconds`` (NaN when empty)."""
    keys = [f"{name}_mean_ms", f"{name}_std_ms", f"{name}_median_ms"] + [f"{name}_p{p}_ms" for p in PERCENTILES]
    if not len(seconds):
        return dict.fromkeys(keys, float("nan"))
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    values = [ms.mean(), ms.std(), np.median(ms)] + [np.percentile(ms, p) for p in PERCENTILES]
    return {key: float(v) for key, v in zip(keys, values)}


def request_tpot(result: RequestResult) -> float | None:
    """Time per output token after the first, or None with fewer than two output tokens."""
    n = result.output_tokens or 0  # the server's usage.completion_tokens
    return (result.latency - result.ttft) / (n - 1) if n > 1 else None


def peak_concurrency(results: Sequence[RequestResult]) -> int:
    """Most requests in flight at once (send to last chunk), over the successful ones."""
    events = sorted([(r.start_time, 1) for r in results] + [(r.start_time + r.latency, -1) for r in results],
                    key=lambda e: (e[0], e[1]))  # an end at the same instant as a start goes first
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def compute_metrics(results: Sequence[RequestResult], duration_s: float, *,
                    goodput_slos: Mapping[str, float] | None = None) -> dict[str, float]:
    """The summary of the successful ``results`` of a run of ``duration_s`` seconds (first send to last end)."""
    if not duration_s > 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    slos = dict(goodput_slos or {})
    unknown = set(slos) - set(SLO_METRICS)
    if unknown:
        raise ValueError(f"unknown goodput SLO {sorted(unknown)}; choose from {', '.join(SLO_METRICS)}")
    done = [r for r in results if r.success]
    tpots = [request_tpot(r) for r in done]
    per_request = {"ttft": [r.ttft for r in done], "tpot": [t or 0.0 for t in tpots],
                   "e2el": [r.latency for r in done]}
    good = sum(all(per_request[name][i] * 1e3 <= slo for name, slo in slos.items()) for i in range(len(done)))
    input_tokens, output_tokens = sum(r.prompt_len for r in done), sum(r.output_tokens or 0 for r in done)
    return {
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration_s,
        "output_throughput": output_tokens / duration_s,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s,
        "request_goodput": good / duration_s if slos else float("nan"),
        "max_concurrent_requests": peak_concurrency(done),
        **latency_stats(per_request["ttft"], "ttft"),
        **latency_stats([t for t in tpots if t is not None], "tpot"),
        **latency_stats([gap for r in done for gap in r.itl], "itl"),
        **latency_stats(per_request["e2el"], "e2el"),
    }


_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
_STATS = ("mean", "median") + tuple(f"p{p}" for p in PERCENTILES)

ROWS: tuple[tuple[str, str, str], ...] = (
    ("successful requests", "completed", "{:.0f}"),
    ("failed requests", "failed", "{:.0f}"),
    ("duration (s)", "duration_s", "{:.2f}"),
    ("total input tokens", "total_input_tokens", "{:.0f}"),
    ("total generated tokens", "total_output_tokens", "{:.0f}"),
    ("request throughput (req/s)", "request_throughput", "{:.3f}"),
    ("request goodput (req/s)", "request_goodput", "{:.3f}"),
    ("output token throughput (tok/s)", "output_throughput", "{:.1f}"),
    ("total token throughput (tok/s)", "total_token_throughput", "{:.1f}"),
    ("peak concurrent requests", "max_concurrent_requests", "{:.0f}"),
    ("device busy (fraction of the run)", "device_busy_fraction", "{:.3f}"),
) + tuple((f"{_LABELS[m]} {s} (ms)", f"{m}_{s}_ms", "{:.1f}") for m in LATENCY_METRICS for s in _STATS)


def online_markdown_table(columns: Mapping[str, Mapping[str, float]]) -> str:
    """A metric-by-run Markdown table; rows no column has (e.g. goodput without SLOs) are left out."""
    return metrics_table(columns, ROWS)
