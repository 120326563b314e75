"""PNG plots for the simulator: predicted-vs-measured step times and request-rate sweeps."""

from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_validation(measured: Sequence[float], predicted: Sequence[float], path: str, *, title: str) -> None:
    """Scatter of predicted against measured step times (ms), with the y = x line."""
    ms = [m * 1e3 for m in measured]
    ps = [p * 1e3 for p in predicted]
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(ms, ps, s=12, alpha=0.7)
    hi = max(ms + ps) * 1.05
    ax.plot([0, hi], [0, hi], "k--", lw=1, label="predicted = measured")
    ax.set(xlabel="measured step time (ms)", ylabel="predicted step time (ms)", title=title,
           xlim=(0, hi), ylim=(0, hi))
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sweep(curves: dict[str, tuple[Sequence[float], Sequence[float]]], path: str, *, title: str,
               bound_s: float | None = None, ylabel: str = "p99 TTFT (s)") -> None:
    """One line per label: offered request rate (x) against a latency (y, log scale)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (rates, values) in curves.items():
        ax.plot(rates, values, marker="o", label=label)
    if bound_s is not None:
        ax.axhline(bound_s, color="k", ls="--", lw=1, label=f"bound {bound_s:g} s")
    ax.set(xlabel="offered load (requests/s)", ylabel=ylabel, title=title, yscale="log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
