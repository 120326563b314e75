"""Offline throughput results: medians over repeats, jaxpaged/hf ratios, greedy agreement and a Markdown table."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from jaxpaged.bench.offline.report import median_summary, ratio_table
from jaxpaged.bench.offline.throughput import BackendRun, summarize
from jaxpaged.bench.offline.throughput_floor import GemmFloor
from jaxpaged.report import markdown_table

_RATIO_METRICS = ("request_throughput", "output_token_throughput", "total_token_throughput")


def throughput_result(runs: Mapping[str, Sequence[BackendRun]], prompts: Sequence[Sequence[int]],
                      floor: GemmFloor | None = None) -> dict:
    """Every run's summary, the per-backend medians and, with both backends, the jaxpaged/hf ratios.

    `token_agreement` is the fraction of prompts whose generated ids are the
    same in both backends' first measured runs (meaningful for greedy runs).
    With a `floor`, each summary also gets its GEMM floor and elapsed/floor,
    and the ratios the largest jaxpaged/hf that floor allows
    (jaxpaged/throughput_floor.py).
    """
    result = {"runs": {name: [_summary(run, prompts, floor) for run in backend_runs]
                       for name, backend_runs in runs.items()}}
    result["median"] = {name: median_summary(summaries) for name, summaries in result["runs"].items()}
    if floor is not None:
        result["gemm_floor"] = dataclasses.asdict(floor)
    if "jaxpaged" in runs and "hf" in runs:
        jp, hf = result["median"]["jaxpaged"], result["median"]["hf"]
        result["ratios"] = {f"{metric}: jaxpaged/hf": jp[metric] / hf[metric] for metric in _RATIO_METRICS}
        if floor is not None:
            result["ratios"]["largest possible at the GEMM floor: hf elapsed / jaxpaged floor"] = (
                hf["elapsed_s"] / jp["gemm_floor_s"])
        pairs = zip(runs["jaxpaged"][0].token_ids, runs["hf"][0].token_ids)
        result["token_agreement"] = sum(a == b for a, b in pairs) / len(prompts)
    return result


def _summary(run: BackendRun, prompts: Sequence[Sequence[int]], floor: GemmFloor | None) -> dict[str, float]:
    summary = summarize(run, prompts)
    if floor is not None:
        summary["gemm_floor_s"] = floor.seconds(summary)
        summary["elapsed_over_gemm_floor"] = summary["elapsed_s"] / summary["gemm_floor_s"]
    return summary


_ROWS = (
    ("requests", "num_requests", "{:.0f}"),
    ("prompt tokens", "prompt_tokens", "{:.0f}"),
    ("output tokens", "output_tokens", "{:.0f}"),
    ("elapsed (s)", "elapsed_s", "{:.2f}"),
    ("request throughput (req/s)", "request_throughput", "{:.3f}"),
    ("output token throughput (tok/s)", "output_token_throughput", "{:.1f}"),
    ("total token throughput (tok/s)", "total_token_throughput", "{:.1f}"),
    ("warm-up / first call (s, excluded)", "warmup_s", "{:.1f}"),
    ("load (s, excluded)", "load_s", "{:.1f}"),
    ("compiles in measured pass", "num_compiles", "{:.0f}"),
    ("prompt tokens computed (cache hits excluded)", "prompt_tokens_computed", "{:.0f}"),
    ("weight-GEMM floor (s)", "gemm_floor_s", "{:.2f}"),
    ("elapsed / GEMM floor", "elapsed_over_gemm_floor", "{:.2f}"),
)


def throughput_table(result: Mapping) -> str:
    """A metrics-by-backend Markdown table of the medians, then the ratios and greedy agreement if present."""
    medians = result["median"]
    names = list(medians)
    table = markdown_table(["metric", *names], [[label, *(fmt.format(medians[n][key]) for n in names)]
                                                for label, key, fmt in _ROWS if key in medians[names[0]]])
    if "ratios" in result:
        table += "\n\n" + ratio_table(result["ratios"],
                                       [["prompts with identical outputs", f"{result['token_agreement']:.0%}"]])
    return table
