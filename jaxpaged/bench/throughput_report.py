"""Offline throughput results: medians over repeats, jaxpaged/hf ratios, greedy agreement and a Markdown table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jaxpaged.bench.report import median_summary
from jaxpaged.bench.throughput import BackendRun, summarize

_RATIO_METRICS = ("request_throughput", "output_token_throughput", "total_token_throughput")


def throughput_result(runs: Mapping[str, Sequence[BackendRun]], prompts: Sequence[Sequence[int]]) -> dict:
    """Every run's summary, the per-backend medians and, with both backends, the jaxpaged/hf ratios.

    `token_agreement` is the fraction of prompts whose generated ids are the
    same in both backends' first measured runs (meaningful for greedy runs).
    """
    result = {"runs": {name: [summarize(run, prompts) for run in backend_runs]
                       for name, backend_runs in runs.items()}}
    result["median"] = {name: median_summary(summaries) for name, summaries in result["runs"].items()}
    if "jaxpaged" in runs and "hf" in runs:
        jp, hf = result["median"]["jaxpaged"], result["median"]["hf"]
        result["ratios"] = {f"{metric}: jaxpaged/hf": jp[metric] / hf[metric] for metric in _RATIO_METRICS}
        pairs = zip(runs["jaxpaged"][0].token_ids, runs["hf"][0].token_ids)
        result["token_agreement"] = sum(a == b for a, b in pairs) / len(prompts)
    return result


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
)


def throughput_table(result: Mapping) -> str:
    """A metrics-by-backend Markdown table of the medians, then the ratios and greedy agreement if present."""
    medians = result["median"]
    names = list(medians)
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, key, fmt in _ROWS:
        lines.append(f"| {label} | " + " | ".join(fmt.format(medians[n][key]) for n in names) + " |")
    if "ratios" in result:
        lines += ["", "| ratio | value |", "|---|---:|"]
        lines += [f"| {name} | {value:.2f} |" for name, value in result["ratios"].items()]
        lines.append(f"| prompts with identical outputs | {result['token_agreement']:.0%} |")
    return "\n".join(lines)
