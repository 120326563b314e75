"""Markdown tables of online-benchmark metrics: one column per run (e.g. offline vs HTTP)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from jaxpaged.bench.online.online_metrics import LATENCY_METRICS, PERCENTILES
from jaxpaged.report import markdown_table

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


def _cell(fmt: str, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def online_markdown_table(columns: Mapping[str, Mapping[str, float]]) -> str:
    """A metric-by-run Markdown table; rows no column has (e.g. goodput without SLOs) are left out."""
    names = list(columns)
    rows = [[label, *(_cell(fmt, columns[n].get(key)) for n in names)] for label, key, fmt in ROWS]
    return markdown_table(["metric", *names], [row for row in rows if any(c != "-" for c in row[1:])])
