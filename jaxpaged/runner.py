"""The model runner: owns params and the KV pool, runs jitted, donated steps.

`step` is a pure function `(params, pool, inputs) -> (outputs, pool')`; the pool
argument is donated so XLA updates it in place. Each distinct bucketed shape
compiles once; `num_compiles` counts traces so benchmarks can report it.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpaged.attention import AttentionBackend, AttentionBatch, StepLayout
from jaxpaged.config import ModelConfig
from jaxpaged.kv.pool import KVPool, copy_blocks, create_pool
from jaxpaged.model import LlamaModel
from jaxpaged.sampling import SamplingBatch, sample
from jaxpaged.step_input import ScheduledSeq, StepInput, build_step_input


class DeviceStepInput(NamedTuple):
    """The device copy of a `StepInput` (its arrays, minus the static layout)."""

    token_ids: jax.Array
    positions: jax.Array
    attention: AttentionBatch
    logits_indices: jax.Array
    sampling: SamplingBatch


@dataclasses.dataclass
class StepOutput:
    """Host-side results of one step, in the caller's sequence order."""

    token_ids: np.ndarray  # [num_seqs] sampled ids
    logprobs: np.ndarray  # [num_seqs] log-probability of each sampled id
    logits: np.ndarray | None = None  # [num_seqs, vocab] when requested
    top_ids: np.ndarray | None = None  # [num_seqs, k] when num_top_logprobs > 0
    top_logprobs: np.ndarray | None = None


class ModelRunner:
    """Runs steps of one model over one paged pool."""

    def __init__(
        self,
        model: LlamaModel,
        num_blocks: int,
        block_size: int,
        *,
        kv_dtype=None,
        backend: AttentionBackend = AttentionBackend(),
        pool_fill_value: float = 0.0,
        kv_scales: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self.config: ModelConfig = model.config
        self.block_size = block_size
        self.backend = backend
        self.graphdef, self.params = nnx.split(model)
        k_scale, v_scale = kv_scales if kv_scales is not None else (None, None)
        self.pool: KVPool = create_pool(self.config, num_blocks, block_size, kv_dtype,
                                        fill_value=pool_fill_value, k_scale=k_scale, v_scale=v_scale)
        self._trace_count = 0
        self._step = jax.jit(self._step_fn, donate_argnums=1,
                             static_argnames=("layout", "return_logits", "num_top_logprobs"))

    @property
    def num_compiles(self) -> int:
        """Distinct step shapes compiled so far."""
        return self._trace_count

    def _step_fn(self, params, pool: KVPool, inputs: DeviceStepInput, *, layout: StepLayout,
                 return_logits: bool, num_top_logprobs: int):
        self._trace_count += 1  # runs once per trace, i.e. once per compiled shape
        model = nnx.merge(self.graphdef, params)
        hidden, pool = model(inputs.token_ids, inputs.positions, pool, inputs.attention, layout,
                             self.backend)
        logits = model.logits(hidden[inputs.logits_indices])
        tokens, logprobs = sample(logits, inputs.sampling)
        out = {"token_ids": tokens, "logprobs": logprobs}
        if return_logits:
            out["logits"] = logits
        if num_top_logprobs:
            top_lp, top_ids = jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), num_top_logprobs)
            out["top_logprobs"], out["top_ids"] = top_lp, top_ids
        return out, pool

    def run_batch(self, batch: list[ScheduledSeq], *, num_top_logprobs: int = 0) -> StepOutput:
        """Lay out the scheduler's batch and run it (the engine's entry point)."""
        with jax.profiler.TraceAnnotation("layout_inputs"):
            step = build_step_input(batch, self.block_size)
        return self.execute(step, num_top_logprobs=num_top_logprobs)

    def execute(self, step: StepInput, *, return_logits: bool = False,
                num_top_logprobs: int = 0) -> StepOutput:
        """Run one step and bring back the sampled tokens (and logits if asked)."""
        inputs = self._device_inputs(step)
        with jax.profiler.TraceAnnotation("device_step"):
            inputs = jax.device_put(inputs)
            out, self.pool = self._step(self.params, self.pool, inputs, layout=step.layout,
                                        return_logits=return_logits, num_top_logprobs=num_top_logprobs)
            host = jax.device_get(out)
        rows = step.order
        return StepOutput(
            token_ids=host["token_ids"][rows],
            logprobs=host["logprobs"][rows],
            logits=host["logits"][rows] if return_logits else None,
            top_ids=host["top_ids"][rows] if num_top_logprobs else None,
            top_logprobs=host["top_logprobs"][rows] if num_top_logprobs else None,
        )

    def lower(self, step: StepInput, *, return_logits: bool = False, num_top_logprobs: int = 0):
        """The jitted step lowered for `step`'s shapes (`.compile().as_text()` shows the optimised HLO)."""
        return self._step.lower(self.params, self.pool, self._device_inputs(step), layout=step.layout,
                                return_logits=return_logits, num_top_logprobs=num_top_logprobs)

    @staticmethod
    def _device_inputs(step: StepInput) -> DeviceStepInput:
        step.check_shapes()
        return DeviceStepInput(
            token_ids=step.token_ids,
            positions=step.positions,
            attention=AttentionBatch(step.slot_mapping, step.block_tables, step.context_lens,
                                     step.query_start, step.query_lens),
            logits_indices=step.logits_indices,
            sampling=SamplingBatch(step.temperature, step.top_k, step.top_p, step.seeds,
                                   step.counters),
        )

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Apply copy-on-write block copies (src -> dst) to the pool, in place."""
        if not pairs:
            return
        size = 1 << (len(pairs) - 1).bit_length()  # pad to a power of two: few compiles
        src = np.zeros(size, np.int32)
        dst = np.full(size, self.pool.num_blocks, np.int32)  # out of range = dropped
        src[:len(pairs)], dst[:len(pairs)] = zip(*pairs)
        self.pool = copy_blocks(self.pool, jnp.asarray(src), jnp.asarray(dst))
