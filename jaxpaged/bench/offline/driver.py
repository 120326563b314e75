"""Drive an Engine through a workload with timed arrivals (`run_workload`), summarize the run (`summarize`) and
compare the summaries of several modes (`mode_ratios`, `markdown_table`, `ratio_table`).

Time is the engine's clock: with a `TimedRunner` it is ``perf_counter`` minus compile time, so latencies and
throughput exclude compiles (reported separately).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxpaged.outputs import RequestOutput, RequestOutputKind
from jaxpaged.report import markdown_table as render_table
from jaxpaged.report import metrics_table
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.workloads import ConversationHistory, WorkloadRequest


@dataclasses.dataclass
class RunRecord:
    """Everything a run produced: finished outputs, the KV state after every step (usage; slots filled and
    reserved, summed over the steps; the most sequences running), wall span and engine counters."""

    outputs: list[RequestOutput]
    kv_usage: list[float]
    filled_slots: int
    reserved_slots: int
    max_running_seqs: int
    start: float
    end: float
    num_preemptions: int
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    num_evictions: int
    spec_num_drafts: int = 0  # speculative decoding: verify steps' sequences, and drafts they accepted
    spec_num_accepted_tokens: int = 0


def run_workload(engine, requests: Sequence[WorkloadRequest], *,
                 on_finish: Callable[[RequestOutput], None] | None = None) -> RunRecord:
    """Run ``requests`` through ``engine`` (fresh: no unfinished requests), sampling KV usage after every step.

    A request is submitted once the engine clock passes ``start + arrival_time`` (and, for a multiturn turn,
    once its previous turn finished); its arrival time is the scheduled one, so queueing before submission
    counts in TTFT. Every request is greedy with ``ignore_eos``: every mode generates the same tokens.
    """
    clock = engine.clock
    history = ConversationHistory()
    pending = sorted(requests, key=lambda r: (r.arrival_time, r.turn))
    by_id = {r.request_id: r for r in requests}
    prompts: dict[str, list[int]] = {}
    outputs: list[RequestOutput] = []
    usage, filled, reserved, running = [], 0, 0, 0
    start = clock()
    while pending or engine.has_unfinished_requests():
        now = clock() - start
        still = []
        for r in pending:
            if r.arrival_time <= now and history.ready(r):
                prompts[r.request_id] = history.full_prompt(r)
                params = SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True,
                                        output_kind=RequestOutputKind.FINAL_ONLY)
                engine.add_request(r.request_id, prompts[r.request_id], params, cache_salt=r.cache_salt,
                                   arrival_time=start + r.arrival_time)
            else:
                still.append(r)
        pending = still
        if not engine.has_unfinished_requests():
            next_arrival = min((r.arrival_time for r in pending), default=now)
            time.sleep(max(0.0, next_arrival - now))
            continue
        finished = engine.step()
        step_filled, step_reserved = engine.kv_slot_usage()
        filled, reserved = filled + step_filled, reserved + step_reserved
        usage.append(engine.kv_stats().usage)
        running = max(running, engine.load().num_running)
        for out in finished:
            request = by_id[out.request_id]
            history.record(request, prompts[out.request_id], out.outputs[0].token_ids)
            outputs.append(out)
            if on_finish is not None:
                on_finish(out)
    kv = engine.kv_stats()
    stats = engine.stats
    return RunRecord(outputs, usage, filled, reserved, running, start, clock(), engine.num_preemptions,
                     kv.prefix_queries_tokens, kv.prefix_hits_tokens, kv.num_evictions,
                     stats.spec_num_drafts, stats.spec_num_accepted_tokens)


def _stats(values: Sequence[float], prefix: str) -> dict[str, float]:
    """Mean, p50 and p99 of ``values`` in milliseconds (NaN when empty)."""
    ms = np.asarray(values, dtype=np.float64) * 1e3
    stats = (ms.mean(), np.median(ms), np.percentile(ms, 99)) if len(ms) else (float("nan"),) * 3
    return {f"{prefix}_{name}_ms": float(v) for name, v in zip(("mean", "p50", "p99"), stats)}


def summarize(record: RunRecord, *, num_compiles: int = 0, compile_s: float = 0.0) -> dict[str, float]:
    """The benchmark's numbers for one run (times in ms, throughput per second, fractions 0-1)."""
    outs = record.outputs
    duration = max(record.end - record.start, 1e-9)
    output_tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    metrics = [o.metrics for o in outs]
    usage = record.kv_usage or [0.0]
    return {
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
        "kv_waste": 1.0 - record.filled_slots / record.reserved_slots if record.reserved_slots else 0.0,
        "max_running_seqs": record.max_running_seqs,
        "num_preemptions": record.num_preemptions,
        "num_evictions": record.num_evictions,
        # tokens a verify step emits per sequence, as vLLM reports it (1.0: no speculation)
        "spec_decode_mean_acceptance_length": (1.0 + record.spec_num_accepted_tokens / record.spec_num_drafts
                                               if record.spec_num_drafts else 1.0),
        "num_compiles": num_compiles,
        "compile_s": compile_s,
    }


def median_summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per-key median of the numbers over repeated runs of one mode, NaNs left out (NaN where all are)."""
    def median(values) -> float:
        finite = [v for v in values if not math.isnan(v)]
        return float(np.median(finite)) if finite else float("nan")
    return {key: median([run[key] for run in runs]) for key, value in runs[0].items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


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
    return metrics_table(summaries, _ROWS) + ("\n\n" + ratio_table(ratios) if ratios else "")


def ratio_table(ratios: Mapping[str, float], extra_rows: Sequence[Sequence[str]] = ()) -> str:
    """Ratios between runs as a two-column Markdown table (then ``extra_rows``)."""
    return render_table(["ratio", "value"], [*([name, f"{value:.2f}"] for name, value in ratios.items()), *extra_rows])
