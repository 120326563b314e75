"""Speculative decoding in the cost model: a verify step's cost and the decode speedup it buys.

A verify step computes k + 1 query tokens per sequence (its last token and k
drafts) over its context `c`, and takes logits at all k + 1 rows, where a
plain decode computes one token and one row of logits. With a per-draft
acceptance rate `alpha` (each draft accepted with that probability, given
every one before it was, as Leviathan et al. model it) a verify step emits
on average

    tau = (1 - alpha ** (k + 1)) / (1 - alpha)

tokens per sequence (vLLM's "mean acceptance length": the accepted drafts
plus the target's own token). The decode speedup at a batch of B sequences
is `tau * t_decode(B) / t_verify(B, k)`: close to tau while a step is bound by
reading the weights (small batches on a GPU), and below 1 once the k extra
tokens per sequence make it compute-bound (large batches), which is where
`disable_by_batch_size` turns speculation off. The proposer's own cost
(n-gram lookup on the host) is not counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from jaxpaged.config import load_config
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import get_profile


def mean_acceptance_length(alpha: float, k: int) -> float:
    """Tokens a verify step emits per sequence at per-draft acceptance rate `alpha` with `k` drafts."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha}, k={k}")
    return float(k + 1) if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def acceptance_rate(tau: float, k: int) -> float:
    """The per-draft acceptance rate whose `mean_acceptance_length` with `k` drafts is `tau` (bisection)."""
    if not 1.0 <= tau <= k + 1:
        raise ValueError(f"a mean acceptance length with k={k} drafts lies in [1, {k + 1}], got {tau}")
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if mean_acceptance_length(mid, k) < tau else (low, mid)
    return (low + high) / 2


def verify_step_time(cost: CostModel, batch_size: int, context: int, k: int) -> float:
    """Seconds of one step verifying `k` drafts for each of `batch_size` sequences of `context` tokens.

    k + 1 query tokens per sequence through the cost model, plus the LM head
    for the k extra logit rows (the cost model counts one row per sequence).
    """
    step = cost.step_time([(k + 1, context)] * batch_size)
    extra_rows = cost.lm_head_flops_per_seq * k * batch_size
    return step + extra_rows / cost.profile.peak_flops


@dataclasses.dataclass(frozen=True)
class SpeculationPoint:
    """One batch size: plain and verify step times and the decode speedup (output tokens per second, on/off)."""

    batch_size: int
    decode_step_s: float
    verify_step_s: float
    mean_acceptance_length: float
    speedup: float


def project_speedup(cost: CostModel, batch_sizes: Sequence[int], *, context: int, k: int,
                    tau: float) -> list[SpeculationPoint]:
    """Decode speedup of speculation at each batch size, at mean acceptance length `tau` (decode steps only)."""
    points = []
    for b in batch_sizes:
        decode = cost.step_time([(1, context)] * b)
        verify = verify_step_time(cost, b, context, k)
        points.append(SpeculationPoint(b, decode, verify, tau, tau * decode / verify))
    return points


def project_workloads(model: str, profile: str, taus: Mapping[str, float], batch_sizes: Sequence[int], *,
                      context: int, k: int) -> tuple[dict, str]:
    """`project_speedup` of ``model`` on ``profile`` at each workload's mean acceptance length ``taus[name]``:
    the result (each workload's per-draft acceptance rate, the rows) and its table."""
    cost = CostModel(load_config(model), get_profile(profile))
    rows = [(name, p) for name, tau in taus.items()
            for p in project_speedup(cost, batch_sizes, context=context, k=k, tau=tau)]
    return ({"acceptance_rates": {name: acceptance_rate(tau, k) for name, tau in taus.items()},
             "rows": [{"workload": name, **dataclasses.asdict(p)} for name, p in rows]}, projection_table(rows))


def projection_table(rows: Sequence[tuple[str, SpeculationPoint]]) -> str:
    """A Markdown table of `(workload, point)` rows."""
    from jaxpaged.report import markdown_table
    return markdown_table(["workload", "batch", "mean acceptance length", "decode step ms", "verify step ms",
                           "speedup"],
                          [[name, p.batch_size, f"{p.mean_acceptance_length:.2f}", f"{p.decode_step_s * 1e3:.2f}",
                            f"{p.verify_step_s * 1e3:.2f}", f"{p.speedup:.2f}x"] for name, p in rows])
