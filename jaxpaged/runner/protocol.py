"""What the engine needs from a runner, and what tiers, snapshots and fp8 need from one that owns a pool.

Runners: `ModelRunner` (the jitted step over a device pool), the simulator's
`SimulatedRunner` (a cost model and a clock), and wrappers that time or record
steps (`jaxpaged.bench.offline.timing.TimedRunner`, `jaxpaged.sim.validate.RecordingRunner`).

What only some runners can do is declared, never probed: every runner has
`capabilities` (`RunnerCapabilities`), and a flag there says the runner
implements the matching protocol below (`moves_blocks`: `BlockMover`,
`owns_kv_pool`: `KVPoolRunner`, `predictable_steps`: `PredictableRunner`,
`counts_device_time`: `DeviceTimeRunner`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from jaxpaged.config import ModelConfig
from jaxpaged.scheduler.output import ModelOutput, SchedulerOutput


class StepHandle(Protocol):
    """A dispatched step; `result()` waits for it and brings its sampled tokens to the host."""

    def result(self) -> ModelOutput:
        ...


@dataclasses.dataclass(frozen=True)
class RunnerCapabilities:
    """What a runner can do beyond executing steps, as the runner declares it (the defaults: a runner that
    computes logits and does nothing more)."""

    computes_logits: bool = True  # real logits per row: prompt logprobs, top logprobs, beam search
    samples_under_token_masks: bool = True  # honours structured output's token masks when it samples
    verifies_drafts: bool = False  # its step checks speculative draft tokens against the model
    moves_blocks: bool = False  # implements `BlockMover`: the lower tiers (host, disk) move its blocks
    owns_kv_pool: bool = False  # implements `KVPoolRunner` (and `BlockMover`): snapshots, fp8 scales, KV transfer
    predictable_steps: bool = False  # implements `PredictableRunner`: the engine may fast-forward decodes
    counts_device_time: bool = False  # implements `DeviceTimeRunner`: busy and wait seconds

    def of_steps(self) -> RunnerCapabilities:
        """What a wrapper that forwards only `execute_model` (a timer, a recorder) can do: its steps' own
        capabilities, none of the pool, prediction or timing members it does not forward."""
        return dataclasses.replace(self, moves_blocks=False, owns_kv_pool=False, predictable_steps=False,
                                   counts_device_time=False)


class Runner(Protocol):
    """Executes the scheduler's steps over a KV pool of `num_blocks` blocks of `block_size` tokens."""

    config: ModelConfig
    block_size: int
    num_blocks: int
    capabilities: RunnerCapabilities

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


class BlockMover(Runner, Protocol):
    """A runner whose pool blocks the lower tiers copy to the host and back (`jaxpaged.offload.KVTiers`).

    The model runner moves real K/V; the simulator's decode-side runner
    (`jaxpaged.sim.pulled_kv`) moves blocks that carry no data, so a
    simulated engine keeps a host tier by the same rules.
    """

    kv_dtype: np.dtype
    kv_block_shape: tuple[int, ...]  # one block: (2, pool tensors (num_layers unless KV cache groups), num_kv_heads, block_size, head_dim)

    def start_read_blocks(self, block_ids: Sequence[int]) -> PendingBlocks:
        """Dispatch a copy of the given blocks to the host (ordered after steps already dispatched)."""
        ...

    def read_blocks(self, block_ids: Sequence[int]) -> list[np.ndarray]:
        """Host copies of the given blocks, one array per block."""
        ...

    def write_blocks(self, block_ids: Sequence[int], blocks: Sequence[np.ndarray]) -> None:
        """Overwrite the given pool blocks with host data (one array per block)."""
        ...


class KVPoolRunner(BlockMover, Protocol):
    """A runner that owns a device KV pool: block transfers, fp8 scales, weights for fingerprints.

    The one owner of the pool arrays: the lower tiers, snapshots and fp8
    calibration change the pool only through these methods.
    """

    params: object

    def warm_read_blocks(self, max_blocks: int) -> None:
        """Compile `start_read_blocks` for every padded count up to `max_blocks` blocks (changes nothing)."""
        ...

    def warm_write_blocks(self, max_blocks: int) -> None:
        """Compile `write_blocks` for every padded count up to `max_blocks` blocks (writes nothing)."""
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

    def attach_draft(self, draft) -> None:
        """Keep a draft model's pool in step with this one (every forward pass, every copy); None: none."""
        ...

    def return_hidden_states(self, enabled: bool) -> None:
        """Whether steps also return the last layer's hidden states at their sample and verify rows."""
        ...


class PredictableRunner(Runner, Protocol):
    """A runner whose every step samples `token` and costs its `cost_model`'s time (the simulator's): the
    engine may run plain decode steps in bulk (`jaxpaged.engine.fast_forward`), booking each with
    `account_step`."""

    token: int
    cost_model: object  # a `jaxpaged.sim.cost_model.CostModel`: `step_time`, `decode_step_time`
    clock: object  # the `jaxpaged.sim.runner.SimClock` its steps advance (`now`)

    def account_step(self, seconds: float) -> None:
        """A step of `seconds` run outside `execute_model`: counted as a step and as busy time."""
        ...


class DeviceTimeRunner(Runner, Protocol):
    """A runner that counts its device's time (the simulated ones)."""

    busy_s: float  # seconds the device spent in steps
    wait_s: float  # host seconds spent waiting for the device (0.0 where the host never waits)
