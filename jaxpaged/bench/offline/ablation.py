"""Block-size ablation: one KV budget in tokens, swept over block sizes and workloads."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from jaxpaged.bench.capacity import max_concurrent_seqs
from jaxpaged.bench.offline.serving import ServingSetup, make_runner, run_mode
from jaxpaged.report import markdown_table
from jaxpaged.sim.workloads import WorkloadRequest

# the metrics recorded per (block size, workload), each plotted against block size
ABLATION_METRICS = ("kv_waste", "max_concurrent_seqs", "max_running_seqs", "prefix_hit_rate",
                    "output_token_throughput", "ttft_p50_ms")


def mean_context_len(requests: Sequence[WorkloadRequest]) -> int:
    """Mean prompt + output length (multiturn: this turn's new tokens only), at least 1."""
    return max(1, round(float(np.mean([len(r.prompt_token_ids) + r.max_tokens for r in requests]))))


def sweep_block_sizes(model, workloads: Mapping[str, Sequence[WorkloadRequest]], block_sizes: Sequence[int],
                      base: ServingSetup, *, kv_budget_tokens: int, mode: str = "prefix_on",
                      on_done: Callable[[dict], None] | None = None) -> list[dict]:
    """Run every workload at every block size with ``kv_budget_tokens`` of KV; one row per pair.

    Each row has the summary of the run plus ``max_concurrent_seqs``: how many
    sequences of the workload's mean length fit the budget with no sharing (the
    block-rounding loss grows with the block size). Compile time is excluded
    from latencies (no warm-up run; see :class:`TimedRunner`).
    """
    rows = []
    for block_size in block_sizes:
        setup = dataclasses.replace(base, block_size=block_size, num_blocks=kv_budget_tokens // block_size)
        runner = make_runner(model, setup)  # one per block size: the pool's shape depends on it
        for name, requests in workloads.items():
            summary = run_mode(model, runner, setup, mode, requests)
            row = {"block_size": block_size, "workload": name, "num_blocks": setup.num_blocks,
                   "max_concurrent_seqs": max_concurrent_seqs(setup.num_blocks, block_size,
                                                              mean_context_len(requests)),
                   **summary}
            rows.append(row)
            if on_done is not None:
                on_done(row)
    return rows


def ablation_table(rows: Sequence[Mapping]) -> str:
    """One row per (block size, workload): every `ABLATION_METRICS` value to 3 significant digits."""
    return markdown_table(["block size", "workload", *ABLATION_METRICS],
                          [[r["block_size"], r["workload"], *(f"{r[m]:.3g}" for m in ABLATION_METRICS)] for r in rows],
                          align="ll" + "r" * len(ABLATION_METRICS))


def ablation_plots(rows: Sequence[Mapping]) -> dict[str, Callable[[], object]]:
    """``block_size_<metric>.png`` for each metric: builds that metric's figure against block size, a line per
    workload."""
    from jaxpaged.bench.offline.plots import plot_metric_vs_block_size
    return {f"block_size_{m}.png": functools.partial(plot_metric_vs_block_size, rows, m) for m in ABLATION_METRICS}
