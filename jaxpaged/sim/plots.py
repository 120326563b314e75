"""Figures for the simulator: predicted-vs-measured step times, request-rate sweeps, prefill:decode splits.

Each function builds a matplotlib `Figure` and returns it; the command saves it
through the one writer (`jaxpaged.report.write_results` / `save_figure`)
into ``--plot_dir``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

DPI = 120


def plot_validation(measured: Sequence[float], predicted: Sequence[float], *, title: str) -> Figure:
    """Scatter of predicted against measured step times (ms, from seconds), with the y = x line."""
    ms = [m * 1e3 for m in measured]
    ps = [p * 1e3 for p in predicted]
    fig = Figure(figsize=(5, 5), dpi=DPI)
    ax = fig.subplots()
    ax.scatter(ms, ps, s=12, alpha=0.7)
    hi = max(ms + ps) * 1.05
    ax.plot([0, hi], [0, hi], "k--", lw=1, label="predicted = measured")
    ax.set(xlabel="measured step time (ms)", ylabel="predicted step time (ms)", title=title,
           xlim=(0, hi), ylim=(0, hi))
    ax.legend(loc="upper left")
    return fig


def plot_sweep(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str,
               bound_s: float | None = None, ylabel: str = "p99 TTFT (s)") -> Figure:
    """One line per label: offered request rate (x) against a latency (y, log scale), the bound dashed."""
    fig = Figure(figsize=(7, 4.5), dpi=DPI)
    ax = fig.subplots()
    for label, (rates, values) in curves.items():
        ax.plot(rates, values, marker="o", label=label)
    if bound_s is not None:
        ax.axhline(bound_s, color="k", ls="--", lw=1, label=f"bound {bound_s:g} s")
    ax.set(xlabel="offered load (requests/s)", ylabel=ylabel, title=title, yscale="log")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def plot_split_goodput(curves: Mapping[str, tuple[Sequence[int], Sequence[float]]],
                       colocated: Mapping[str, float], *, num_instances: int, title: str) -> Figure:
    """Goodput (y) against the number of prefill instances of a split (x), one line per label (an SLO),
    and each label's colocated goodput as a dashed line of the same colour."""
    fig = Figure(figsize=(7, 4.5), dpi=DPI)
    ax = fig.subplots()
    for label, (prefill, goodput) in curves.items():
        line, = ax.plot(prefill, goodput, marker="o", label=f"split, {label}")
        if label in colocated:
            ax.axhline(colocated[label], color=line.get_color(), ls="--", lw=1, label=f"colocated, {label}")
    ax.set(xlabel=f"prefill instances (of {num_instances}; the rest decode)", ylabel="goodput (requests/s)",
           title=title, xticks=list(range(1, num_instances)))
    top = max([max(g, default=0.0) for _, g in curves.values()] + list(colocated.values()) + [0.0])
    ax.set_ylim(0, top * 1.25 or 1.0)  # room above the lines for the legend
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def plot_attainment(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str) -> Figure:
    """SLO attainment (y, fraction of requests) against offered load (x), one line per deployment layout."""
    fig = Figure(figsize=(7, 4.5), dpi=DPI)
    ax = fig.subplots()
    for label, (rates, attainment) in curves.items():
        ax.plot(rates, attainment, marker="o", ls="--" if label.startswith("colocated") else "-", label=label)
    ax.set(xlabel="offered load (requests/s)", ylabel="SLO attainment (both objectives)", title=title,
           ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig
