"""What the engine needs from a runner, and what tiers, snapshots and fp8 need from one that owns a pool.

Runners: `ModelRunner` (the jitted step over a device pool), the simulator's
`SimulatedRunner` (a cost model and a clock), and wrappers that time or record
steps (`jaxpaged.bench.offline.timing.TimedRunner`, `jaxpaged.sim.validate.RecordingRunner`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from jaxpaged.config import ModelConfig
from jaxpaged.scheduler.output import ModelOutput, SchedulerOutput


class StepHandle(Protocol):
    """A dispatched step; `result()` waits for it and brings its sampled tokens to the host."""

    def result(self) -> ModelOutput:
        ...


class Runner(Protocol):
    """Executes the scheduler's steps over a KV pool of `num_blocks` blocks of `block_size` tokens."""

    config: ModelConfig
    block_size: int
    num_blocks: int

    @property
    def num_compiles(self) -> int:
        """Distinct step shapes compiled so far."""
        ...

    def execute_model(self, scheduler_output: SchedulerOutput) -> StepHandle:
        """Apply the output's changes to the persistent batch and dispatch its step; returns without waiting."""
        ...

    def reset(self) -> None:
        """Forget every row of the persistent batch: a new engine is taking the runner over."""
        ...


class PendingBlocks(Protocol):
    """Blocks being copied from the device pool to host memory."""

    def result(self) -> list[np.ndarray]:
        """One host array `[2, num_layers, num_kv_heads, block_size, head_dim]` per block (K then V)."""
        ...


@runtime_checkable
class KVPoolRunner(Runner, Protocol):
    """A runner that owns a device KV pool: block transfers, fp8 scales, weights for fingerprints.

    The one owner of the pool arrays: the lower tiers, snapshots and fp8
    calibration change the pool only through these methods.
    """

    kv_dtype: np.dtype
    kv_block_shape: tuple[int, ...]  # one block: (2, pool tensors (num_layers unless KV cache groups), num_kv_heads, block_size, head_dim)
    params: object

    def start_read_blocks(self, block_ids: Sequence[int]) -> PendingBlocks:
        """Dispatch a copy of the given blocks to the host (ordered after steps already dispatched)."""
        ...

    def read_blocks(self, block_ids: Sequence[int]) -> list[np.ndarray]:
        """Host copies of the given blocks, one array per block."""
        ...

    def write_blocks(self, block_ids: Sequence[int], blocks: Sequence[np.ndarray]) -> None:
        """Overwrite the given pool blocks with host data (one array per block)."""
        ...

    def kv_scales(self) -> tuple[np.ndarray, np.ndarray]:
        """The pool's fp8 scales `(k_scale, v_scale)`, each `[num_layers, num_kv_heads]` (1.0 unless fp8)."""
        ...

    def set_kv_scales(self, k_scale: np.ndarray, v_scale: np.ndarray) -> None:
        """Replace the pool's fp8 scales (before anything is written with the old ones)."""
        ...

    def calibrate_kv_scales(self, token_ids: Sequence[int], margin: float) -> None:
        """Set fp8 scales from the K/V absmax of running `token_ids` through a float32 pool."""
        ...
