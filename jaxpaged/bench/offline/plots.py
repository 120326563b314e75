"""Figures of offline results: ablation metrics against block size, replay hit rates against capacity. Each
function builds a matplotlib `Figure`; the writer (`jaxpaged.report.write_results`) saves it into --plot_dir."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure


def plot_metric_vs_block_size(rows: Sequence[dict], metric: str, *, title: str = "") -> Figure:
    """``metric`` against ``block_size`` (log2 axis), a line per workload in ``rows``."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for workload in dict.fromkeys(r["workload"] for r in rows):
        points = sorted((r["block_size"], r[metric]) for r in rows if r["workload"] == workload)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=workload)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel(metric)
    ax.set_title(title or f"{metric} vs block size")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def plot_hit_rate_vs_capacity(rows: Sequence[dict], *, title: str = "", note: str = "") -> Figure:
    """Hit rate against cache capacity in tokens (log axis), a line per policy, the unbounded hit rate
    dashed; ``rows`` are replay results (``policy``, ``capacity_tokens``, ``hit_rate``) of one block size."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for policy in dict.fromkeys(r["policy"] for r in rows if r["policy"] != "unbounded"):
        points = sorted((r["capacity_tokens"], r["hit_rate"]) for r in rows if r["policy"] == policy)
        ax.plot([p[0] for p in points], [100 * p[1] for p in points], marker="o", label=policy,
                linestyle=("-", "--", ":", "-.")[len(ax.lines) % 4])  # coinciding curves stay visible
    for r in rows:
        if r["policy"] == "unbounded":
            ax.axhline(100 * r["hit_rate"], color="gray", linestyle="--", label="unbounded")
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (tokens)")
    ax.set_ylabel("prefix-cache hit rate (% of prompt tokens)")
    ax.set_title(title or "hit rate vs capacity")
    if note:
        ax.text(0.01, 0.90, note, transform=ax.transAxes, va="top", fontsize=8)
    ax.grid(True, alpha=0.3, which="both")
    ax.legend()
    return fig
