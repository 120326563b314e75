"""Figures for the simulator: predicted-vs-measured step times and request-rate sweeps.

Each function builds a matplotlib `Figure` and returns it; the command saves it
through the one writer (`jaxpaged.bench.output.write_results` / `save_figure`)
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
