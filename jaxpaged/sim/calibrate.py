"""Fit the "cpu" device profile to measured steps of a real model on this machine.

`calibration_batches` builds synthetic steps of varied shapes (pure prefills of
several lengths, pure decode batches of several sizes and context lengths);
`measure_batches` times the real `ModelRunner` on them, interleaved so machine
noise hits every shape alike, and keeps the median per shape; `fit_profile`
chooses the effective FLOP/s, bandwidth and overheads that minimise the squared
relative error of the cost model's predictions.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np
import scipy.optimize

from jaxpaged.config import DEFAULT_BLOCK_SIZE, ModelConfig
from jaxpaged.mathutils import cdiv
from jaxpaged.runner.step_input import ScheduledSeq, build_step_input
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.profiles import DeviceProfile

Shape = list[tuple[int, int]]  # (new tokens, context before) per sequence


def batch_shape(batch: Sequence[ScheduledSeq]) -> Shape:
    """The (new tokens, context before) pairs the cost model reads from a batch."""
    return [(len(s.token_ids), s.num_computed_tokens) for s in batch]


def synthetic_batch(shape: Shape, block_size: int, rng: np.random.Generator) -> list[ScheduledSeq]:
    """Scheduled sequences of the given shape over disjoint, shuffled blocks (contents irrelevant)."""
    needed = [cdiv(n + c, block_size) for n, c in shape]
    blocks = rng.permutation(sum(needed)).tolist()
    batch, at = [], 0
    for (n, c), k in zip(shape, needed):
        batch.append(ScheduledSeq(rng.integers(0, 256, n).tolist(), c, blocks[at:at + k]))
        at += k
    return batch


def calibration_shapes() -> list[Shape]:
    """Synthetic steps spanning what an engine runs: prefills, decode batches, chunked prefill + decodes.

    Prefills from scratch and over cached context; decode batches of 1 to 64
    sequences at short and long context; prefill chunks batched with decodes.
    Different from validation, which times the engine's own steps on a request
    workload.
    """
    shapes = [[(n, 0)] for n in (16, 64, 128, 256, 512)]
    shapes += [[(128, 0)] * 4, [(128, 512)], [(64, 896)] * 2, [(32, 256)] * 8, [(256, 640)]]
    shapes += [[(1, ctx)] * b for b in (1, 2, 4, 8, 16, 32, 64) for ctx in (128, 1024)]
    shapes += [[(256, 128)] + [(1, 512)] * 4, [(128, 384)] + [(1, 700)] * 12,
               [(192, 448), (64, 0)] + [(1, 600)] * 8]
    return shapes


def step_kind(shape: Shape) -> str:
    """"decode" (every sequence computes one token), "prefill" (none does), or "mixed"."""
    decodes = sum(1 for n, _ in shape if n == 1)
    return "decode" if decodes == len(shape) else "prefill" if decodes == 0 else "mixed"


def measure_batches(runner, batches: list[list[ScheduledSeq]], repeats: int) -> list[float]:
    """Median seconds of one step per batch on a `ModelRunner`, after one compile/warm-up call each.

    A step is timed from laying it out to its sampled ids on the host (a full round trip).
    """
    def run(batch):
        runner.execute(build_step_input(batch, runner.block_size))

    for batch in batches:
        run(batch)
    times = [[] for _ in batches]
    for _ in range(repeats):
        for i, batch in enumerate(batches):
            start = time.perf_counter()
            run(batch)
            times[i].append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def fit_profile(config: ModelConfig, shapes: list[Shape], measured: Sequence[float], *, name: str = "cpu",
                block_size: int = DEFAULT_BLOCK_SIZE, weight_bytes_per_param: float = 4.0,
                kv_bytes_per_element: float = 4.0, memory_bytes: int = 0, phase_overlap: bool = True,
                grid: np.ndarray | None = None) -> DeviceProfile:
    """The profile (padded shapes) whose predictions have the least relative squared error.

    GEMM FLOP/s, attention FLOP/s and bandwidth are fitted separately: on a
    CPU the XLA reference attention (gathers, masked softmax) runs far below
    GEMM speed. With `phase_overlap` (max of compute and memory per phase) the
    rates are searched on a log grid, overheads solved by least squares at each
    point; without it the model is linear in the inverse rates and overheads,
    solved at once by non-negative least squares.
    """
    measured = np.asarray(measured, float)
    probe = CostModel(config, DeviceProfile(name, 1.0, 1.0, 0.0, memory_bytes, padded_shapes=True),
                      block_size=block_size, weight_bytes_per_param=weight_bytes_per_param,
                      kv_bytes_per_element=kv_bytes_per_element)
    costs = [probe.step_cost(s) for s in shapes]
    if not phase_overlap:
        return _fit_linear(name, costs, measured, memory_bytes)
    work = np.array([[c.dense_flops, c.dense_bytes, c.attn_flops, c.attn_bytes] for c in costs])
    counts = np.array([[1.0, c.num_seqs] for c in costs])
    best = (np.inf, None)
    grid = np.logspace(8, 13, 51) if grid is None else np.asarray(grid, float)
    for flops in grid:
        dense = np.maximum(work[:, 0] / flops, work[:, 1] / grid[:, None])  # [bandwidth, shape]
        for attn_flops in grid[grid <= flops]:
            attn = np.maximum(work[:, 2] / attn_flops, work[:, 3] / grid[:, None])
            for i, bw in enumerate(grid):
                overheads, err = _fit_overheads(measured, dense[i] + attn[i], counts)
                if err < best[0]:
                    best = (err, (flops, attn_flops, bw, *overheads))
    flops, attn_flops, bw, step_oh, seq_oh = best[1]
    return DeviceProfile(name, peak_flops=float(flops), memory_bandwidth=float(bw),
                         step_overhead_s=float(step_oh), memory_bytes=memory_bytes, padded_shapes=True,
                         per_seq_overhead_s=float(seq_oh), attention_flops=float(attn_flops))


def _fit_linear(name: str, costs: list, measured: np.ndarray, memory_bytes: int) -> DeviceProfile:
    """Sum-of-phases fit: time = step + seq * S + dense_flops / F + attn_flops / A + attn_bytes / BW."""
    features = np.array([[1.0, c.num_seqs, c.dense_flops, c.attn_flops, c.attn_bytes] for c in costs])
    w = 1.0 / measured  # relative error: weight each row by 1 / measured
    coef, _ = scipy.optimize.nnls(features * w[:, None], measured * w)
    step_oh, seq_oh, per_flop, per_attn_flop, per_byte = (float(c) for c in coef)
    tiny = 1e-30  # a zero coefficient: that work costs nothing here (an effectively infinite rate)
    return DeviceProfile(name, peak_flops=1 / max(per_flop, tiny), memory_bandwidth=1 / max(per_byte, tiny),
                         step_overhead_s=step_oh, memory_bytes=memory_bytes, padded_shapes=True,
                         per_seq_overhead_s=seq_oh, attention_flops=1 / max(per_attn_flop, tiny),
                         phase_overlap=False)


def _fit_overheads(measured: np.ndarray, roof: np.ndarray, counts: np.ndarray) -> tuple[tuple[float, ...], float]:
    """Non-negative overheads (per step, per sequence) minimising relative squared error, and that error."""
    w = 1.0 / measured  # relative error: weight each row by 1 / measured
    a = counts * w[:, None]
    b = (measured - roof) * w
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    coef = np.maximum(coef, 0.0)
    resid = a @ coef - b
    return tuple(float(c) for c in coef), float(resid @ resid)


@dataclasses.dataclass(frozen=True)
class ErrorSummary:
    """Relative errors |predicted - measured| / measured over a set of steps."""

    median: float
    p90: float
    max: float
    num_steps: int


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> ErrorSummary:
    """Summarise per-step relative prediction errors."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    err = np.abs(p - m) / m
    return ErrorSummary(float(np.median(err)), float(np.percentile(err, 90)), float(err.max()), len(err))
