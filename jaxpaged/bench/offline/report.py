"""Turn run records into per-mode summaries, ratios between modes and a Markdown table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from jaxpaged.bench.offline.driver import RunRecord
from jaxpaged.report import markdown_table as render_table


def _stats(values: Sequence[float], prefix: str) -> dict[str, float]:
    """Mean, p50 and p99 of ``values`` in milliseconds (NaN when empty)."""
    if not values:
        return {f"{prefix}_mean_ms": float("nan"), f"{prefix}_p50_ms": float("nan"),
                f"{prefix}_p99_ms": float("nan")}
    ms = np.asarray(values, dtype=np.float64) * 1e3
    return {f"{prefix}_mean_ms": float(ms.mean()), f"{prefix}_p50_ms": float(np.median(ms)),
            f"{prefix}_p99_ms": float(np.percentile(ms, 99))}


def summarize(record: RunRecord, *, num_compiles: int = 0, compile_s: float = 0.0) -> dict[str, float]:
    """The benchmark's numbers for one run (times in ms, throughput per second, fractions 0-1)."""
    outs = record.outputs
    duration = max(record.end - record.start, 1e-9)
    output_tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    metrics = [o.metrics for o in outs]
    reserved = sum(s.reserved_slots for s in record.samples)
    filled = sum(s.filled_slots for s in record.samples)
    usage = [s.usage for s in record.samples] or [0.0]
    summary = {
        "num_requests": len(outs),
        "duration_s": duration,
        "request_throughput": len(outs) / duration,
        "output_token_throughput": output_tokens / duration,
        **_stats([m.ttft for m in metrics if m.ttft is not None], "ttft"),
        **_stats([m.tpot for m in metrics if m.tpot is not None], "tpot"),
        **_stats([gap for m in metrics for gap in m.inter_token_latencies], "itl"),
        **_stats([m.e2e_latency for m in metrics if m.e2e_latency is not None], "e2e"),
        "prefix_hit_rate": (record.prefix_hits_tokens / record.prefix_queries_tokens
                            if record.prefix_queries_tokens else 0.0),
        "cached_prompt_tokens": sum(o.num_cached_tokens for o in outs),
        "kv_usage_peak": max(usage),
        "kv_usage_mean": float(np.mean(usage)),
        # slot-steps reserved but not holding a token, over slot-steps reserved
        "kv_waste": 1.0 - filled / reserved if reserved else 0.0,
        "max_running_seqs": max((s.num_running for s in record.samples), default=0),
        "num_preemptions": record.num_preemptions,
        "num_evictions": record.num_evictions,
        # tokens a verify step emits per sequence, as vLLM reports it (1.0: no speculation)
        "spec_decode_mean_acceptance_length": (1.0 + record.spec_num_accepted_tokens / record.spec_num_drafts
                                               if record.spec_num_drafts else 1.0),
        "num_compiles": num_compiles,
        "compile_s": compile_s,
    }
    return summary


def median_summary(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per-key median over repeated runs of one mode."""
    return {key: float(np.median([run[key] for run in runs])) for key in runs[0]}


# metrics compared between modes as plain ratios a/b
_RATIO_METRICS = ("request_throughput", "output_token_throughput", "ttft_p50_ms", "kv_waste", "max_running_seqs")


def mode_ratios(summaries: Mapping[str, Mapping[str, float]], baselines: Sequence[tuple[str, str]]
                ) -> dict[str, float]:
    """``"<metric>: <a>/<b>"`` ratios for every pair ``(a, b)`` present in ``summaries``."""
    ratios = {}
    for a, b in baselines:
        if a not in summaries or b not in summaries:
            continue
        for metric in _RATIO_METRICS:
            denominator = summaries[b][metric]
            ratios[f"{metric}: {a}/{b}"] = summaries[a][metric] / denominator if denominator else float("nan")
    return ratios


_ROWS = (
    ("requests", "num_requests", "{:.0f}"),
    ("request throughput (req/s)", "request_throughput", "{:.3f}"),
    ("output token throughput (tok/s)", "output_token_throughput", "{:.1f}"),
    ("TTFT mean (ms)", "ttft_mean_ms", "{:.0f}"),
    ("TTFT p50 (ms)", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p99 (ms)", "ttft_p99_ms", "{:.0f}"),
    ("TPOT mean (ms)", "tpot_mean_ms", "{:.1f}"),
    ("ITL p50 (ms)", "itl_p50_ms", "{:.1f}"),
    ("ITL p99 (ms)", "itl_p99_ms", "{:.1f}"),
    ("prefix cache hit rate", "prefix_hit_rate", "{:.1%}"),
    ("KV usage peak", "kv_usage_peak", "{:.1%}"),
    ("KV usage mean", "kv_usage_mean", "{:.1%}"),
    ("KV waste (reserved, unfilled)", "kv_waste", "{:.1%}"),
    ("max running seqs", "max_running_seqs", "{:.0f}"),
    ("preemptions", "num_preemptions", "{:.0f}"),
    ("compiles", "num_compiles", "{:.0f}"),
    ("compile time (s, excluded)", "compile_s", "{:.1f}"),
)


def markdown_table(summaries: Mapping[str, Mapping[str, float]], ratios: Mapping[str, float] | None = None) -> str:
    """A metrics-by-mode Markdown table, then a table of ratios between modes."""
    modes = list(summaries)
    table = render_table(["metric", *modes], [[label, *(fmt.format(summaries[m][key]) for m in modes)]
                                              for label, key, fmt in _ROWS])
    return table + ("\n\n" + ratio_table(ratios) if ratios else "")


def ratio_table(ratios: Mapping[str, float], extra_rows: Sequence[Sequence[str]] = ()) -> str:
    """Ratios between runs as a two-column Markdown table (then ``extra_rows``)."""
    return render_table(["ratio", "value"], [*([name, f"{value:.2f}"] for name, value in ratios.items()), *extra_rows])
