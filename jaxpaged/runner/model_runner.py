"""The model runner: owns the weights, the KV pool and the persistent batch; runs jitted, donated steps.

The step is a pure function `(params, pool, last_tokens, inputs) -> (outputs,
pool', last_tokens')`. The pool is donated so XLA updates it in place, and so
is `last_tokens`: each persistent-batch row's most recent sample, kept on the
device. A decode whose input is the token the previous step sampled reads it
from there, so the host can lay out and dispatch step N+1 before it has read
step N's tokens (asynchronous scheduling). Each distinct bucketed shape
compiles once; `num_compiles` counts traces so benchmarks can report it.

The runner is the one owner of the pool: copy-on-write copies, the lower
tiers' block transfers, snapshot restores and fp8 scales all go through its
methods.

With `tensor_parallel_size=N > 1` the weights and the pool are split over a
mesh of N devices (`jaxpaged.parallel`): the step is jitted with explicit
input and output shardings (weights and pool split, step inputs and outputs
replicated), and each layer's K/V write and attention run under `shard_map`
on local heads. The runner's interface is unchanged: block ids, block tables
and host block copies mean the same thing at any N (logical KV heads).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpaged.attention import AttentionBackend, AttentionBatch, StepLayout
from jaxpaged.cache.kv_groups import kv_cache_layout
from jaxpaged.config import ModelConfig
from jaxpaged.kv_pool.fp8 import DEFAULT_SCALE_MARGIN, pool_absmax, scales_from_absmax
from jaxpaged.kv_pool.pool import KVPool, copy_blocks, create_pool, num_pool_tensors
from jaxpaged.mathutils import cdiv, next_power_of_two
from jaxpaged.model import DecoderModel
from jaxpaged.model.cpu_gemm import route_model
from jaxpaged.offload.transfer import finish_gather, padded_counts, scatter_blocks, start_gather
from jaxpaged.parallel import TensorParallel
from jaxpaged.parallel.placement import shard_model
from jaxpaged.runner import cpu_step
from jaxpaged.runner.input_batch import InputBatch
from jaxpaged.runner.logit_controls import LogitControls, apply_logit_controls, empty_controls
from jaxpaged.runner.protocol import RunnerCapabilities
from jaxpaged.runner.rejection import verify_draft_tokens
from jaxpaged.runner.sampling import SamplingBatch
from jaxpaged.runner.sampling import sample as _sample_tokens
from jaxpaged.runner.step_input import ScheduledSeq, StepInput, build_step_input
from jaxpaged.scheduler.output import ModelOutput, SchedulerOutput
from jaxpaged.spec_decode.proposer import StepFollower
from jaxpaged.structured.bitmask import TokenMasks, apply_token_bitmask, empty_token_masks, pad_token_masks

logger = logging.getLogger(__name__)


class DeviceStepInput(NamedTuple):
    """The device copy of a `StepInput` (its arrays, minus the static layout)."""

    token_ids: jax.Array
    token_src_rows: jax.Array
    positions: jax.Array
    attention: AttentionBatch
    logits_indices: jax.Array
    sampling: SamplingBatch
    sample_rows: jax.Array
    controls: LogitControls
    token_masks: TokenMasks
    prompt_logprob_rows: jax.Array
    prompt_logprob_targets: jax.Array
    verify_rows: jax.Array
    verify_drafts: jax.Array
    verify_seq_rows: jax.Array
    verify_counters: jax.Array


class PendingStep:
    """A dispatched step: device arrays still being computed, and how to put their rows in caller order."""

    def __init__(self, outputs: dict[str, jax.Array], order: np.ndarray):
        self._outputs = outputs
        self._order = order

    def result(self) -> ModelOutput:
        """Wait for the step and bring its results to the host, in the caller's sequence order."""
        host = jax.device_get(jax.tree.map(_local_copy, self._outputs))
        rows = self._order
        return ModelOutput(
            token_ids=host["token_ids"][rows],
            logprobs=host["logprobs"][rows],
            top_ids=host["top_ids"][rows] if "top_ids" in host else None,
            top_logprobs=host["top_logprobs"][rows] if "top_logprobs" in host else None,
            logits=host["logits"][rows] if "logits" in host else None,
            prompt_logprobs=host.get("prompt_logprobs"),  # span order, not row order
            prompt_top_ids=host.get("prompt_top_ids"),
            prompt_top_logprobs=host.get("prompt_top_logprobs"),
            verify_ids=host.get("verify_ids"),  # span order, not row order
            verify_logprobs=host.get("verify_logprobs"),
            hidden_states=host["hidden_states"][rows] if "hidden_states" in host else None,
            verify_hidden_states=host.get("verify_hidden_states"),
        )


class MaskPendingStep(PendingStep):
    """A step whose forward pass is dispatched and whose sampling waits for its token masks.

    The host fills the masks while the forward pass runs (it needs the
    previous step's tokens first), then `sample` dispatches the sampling half.
    """

    def __init__(self, runner: "ModelRunner", outputs: dict[str, jax.Array], logits, inputs: DeviceStepInput,
                 order: np.ndarray):
        super().__init__(outputs, order)
        self._runner, self._logits, self._inputs = runner, logits, inputs
        self._sampled = False

    def sample(self, indices: list[int], bits: np.ndarray | None) -> None:
        """Dispatch the sampling half with the masks of the caller's sequences `indices` (`bits`: `[C, W]`)."""
        masks = empty_token_masks() if not indices else pad_token_masks(self._order[indices], bits)
        self._outputs.update(self._runner._dispatch_sample(self._logits, self._inputs, masks))
        self._logits = self._inputs = None
        self._sampled = True

    def result(self) -> ModelOutput:
        """As `PendingStep.result`; `sample` must have been called."""
        if not self._sampled:
            raise RuntimeError("the step's sampling half was never dispatched (call sample() first)")
        return super().result()


def _step_tokens(last_tokens: jax.Array, token_src_rows: jax.Array, token_ids: jax.Array) -> jax.Array:
    """The step's input tokens: a token the previous step sampled (`token_src_rows[i]` >= 0, overlapped steps)
    is read from its persistent row of `last_tokens`, the others are the host's `token_ids`."""
    return jnp.where(token_src_rows >= 0, last_tokens[jnp.maximum(token_src_rows, 0)], token_ids)


def _sample_and_keep(last_tokens: jax.Array, logits: jax.Array, processed: jax.Array | None,
                     sampling: SamplingBatch, sample_rows: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    """Sample each row from `processed` (raw `logits` when None) and keep each sample in its persistent row."""
    tokens, logprobs = _sample_tokens(logits, sampling, processed)
    keep = jnp.where(sample_rows >= 0, sample_rows, last_tokens.shape[0])  # -1: dropped
    return {"token_ids": tokens, "logprobs": logprobs}, last_tokens.at[keep].set(tokens, mode="drop")


def _prompt_logprobs(model, hidden, inputs: DeviceStepInput, k: int) -> dict[str, jax.Array]:
    """Each listed token row's log-probability of the prompt token after it (and its top k), raw logits."""
    logprobs = jax.nn.log_softmax(model.logits(hidden[inputs.prompt_logprob_rows]).astype(jnp.float32), axis=-1)
    out = {"prompt_logprobs": jnp.take_along_axis(logprobs, inputs.prompt_logprob_targets[:, None], axis=-1)[:, 0]}
    if k:
        out["prompt_top_logprobs"], out["prompt_top_ids"] = jax.lax.top_k(logprobs, k)
    return out


def _verify(model, hidden, inputs: DeviceStepInput) -> dict[str, jax.Array]:
    """Each verify row's token (its draft when accepted, else the target's) and its log-probability (raw
    logits): greedy rows match the argmax, sampled rows rejection-sample (`jaxpaged.runner.rejection`)."""
    seq = inputs.verify_seq_rows
    s = inputs.sampling
    params = SamplingBatch(s.temperature[seq], s.top_k[seq], s.top_p[seq], s.seeds[seq], inputs.verify_counters,
                           None if s.min_p is None else s.min_p[seq])
    ids, logprobs = verify_draft_tokens(model.logits(hidden[inputs.verify_rows]), inputs.verify_drafts, params)
    return {"verify_ids": ids, "verify_logprobs": logprobs}


def _or_empty(array: np.ndarray | None) -> np.ndarray:
    return np.zeros(0, np.int32) if array is None else array


def _local_copy(array: jax.Array) -> jax.Array:
    """A replicated array's copy on one of this process's devices (the whole array even when multi-host)."""
    return array if array.is_fully_addressable else array.addressable_data(0)


class _NoStep:
    """The handle of a step with nothing scheduled (only changes applied)."""

    def result(self) -> ModelOutput:
        return ModelOutput(token_ids=np.zeros(0, np.int32), logprobs=np.zeros(0, np.float32))


class _PendingBlocks:
    def __init__(self, gathered: jax.Array, num_blocks: int, to_logical):
        self._gathered, self._num_blocks, self._to_logical = gathered, num_blocks, to_logical

    def result(self) -> list[np.ndarray]:
        return [self._to_logical(b) for b in finish_gather(self._gathered, self._num_blocks)]


class ModelRunner:
    """Runs steps of one model over one paged pool (implements `KVPoolRunner`)."""

    capabilities = RunnerCapabilities(verifies_drafts=True, moves_blocks=True, owns_kv_pool=True)

    def __init__(
        self,
        model: DecoderModel,
        num_blocks: int,
        block_size: int,
        *,
        kv_dtype=None,
        backend: AttentionBackend = AttentionBackend(),
        pool_fill_value: float = 0.0,
        kv_scales: tuple[np.ndarray, np.ndarray] | None = None,
        max_num_seqs: int = 64,
        tensor_parallel_size: int = 1,
        cpu_compiler_options: str = cpu_step.AUTO,
        cpu_gemm: str = cpu_step.AUTO,
    ):
        """`max_num_seqs` sizes the persistent batch at first (it grows when forks need more rows).

        `tensor_parallel_size` > 1 splits the weights and the pool over that many
        devices (ValueError if the model's heads do not split that way).
        `cpu_compiler_options`: XLA:CPU's dot path for the step (`jaxpaged.runner.cpu_step`; CPU only).
        `cpu_gemm`: which weight GEMMs run through oneDNN instead (`cpu_step.gemm_route`; CPU only, one device).
        """
        self.config: ModelConfig = model.config
        self.block_size = block_size
        self.num_blocks = num_blocks
        # the split over devices (None: one device); `tp.mesh`, `tp.pool_pages` etc. say where things live
        self.tp = TensorParallel.create(self.config, tensor_parallel_size) if tensor_parallel_size > 1 else None
        route = cpu_step.gemm_route(cpu_gemm, jax.default_backend(), model.embed_tokens.embedding[...].dtype,
                                    tensor_parallel_size)
        if route is not None:  # a copy of the model whose projections and LM head call oneDNN
            model = route_model(model, route)
        if self.tp is None:
            self.backend = backend
            self.graphdef, self.params = nnx.split(model)
        else:
            self.backend = dataclasses.replace(backend, mesh=self.tp.mesh)
            self.graphdef, self.params = shard_model(model, self.tp)
        k_scale, v_scale = kv_scales if kv_scales is not None else (None, None)
        self._pool: KVPool = self._create_pool(kv_dtype, pool_fill_value, k_scale, v_scale)
        self.kv_dtype = np.dtype(self._pool.dtype)
        self.kv_layout = kv_cache_layout(self.config.layer_windows)
        # a block id holds one pool tensor per layer of its KV cache group (all layers without groups)
        self.kv_block_shape = (2, self.kv_layout.num_tensors, self.config.num_kv_heads, block_size,
                               self.config.head_dim)
        # on CPU the weights' dtype picks the dot path and the fewest decode rows (`cpu_step`); elsewhere neither
        cpu_step.check_setting(cpu_compiler_options)
        self._cpu_compiler_options = cpu_compiler_options
        self._platform, self._weight_dtype = jax.default_backend(), model.embed_tokens.embedding[...].dtype
        self.min_decode_rows = cpu_step.min_decode_rows(self._platform, self._weight_dtype)
        self.input_batch = InputBatch(block_size, max_num_seqs, self.kv_layout.windows,
                                      min_decode_rows=self.min_decode_rows)
        self._last_tokens = self._put(np.zeros(self.input_batch.capacity, np.int32))
        self._trace_count = 0
        self._shardings = {}
        if self.tp is not None:
            replicated = self.tp.replicated
            param_shardings = jax.tree.map(lambda x: x.sharding, self.params)
            self._shardings = dict(in_shardings=(param_shardings, self._pool_shardings(), replicated, replicated),
                                   out_shardings=(replicated, self._pool_shardings(), replicated))
        self._step_jits: dict[tuple, tuple] = {}  # by compile options: (whole step, forward half)
        self._sample = jax.jit(self._sample_fn, donate_argnums=(0,))
        self._resolve_tokens = jax.jit(_step_tokens)  # the draft model's copy of a step's input tokens
        self._draft: StepFollower | None = None
        self._return_hidden_states = False  # read when a step is traced: set before the first step

    def compiler_options(self, step: StepInput) -> dict[str, object]:
        """The XLA compile options of `step`'s shape (`jaxpaged.runner.cpu_step`; empty off the CPU platform)."""
        return cpu_step.step_compiler_options(self._cpu_compiler_options, self._platform, self._weight_dtype,
                                              len(step.token_ids))

    def _jitted(self, step: StepInput) -> tuple:
        """The jitted (whole step, forward half) for `step`'s compile options, built on first use.

        The pool (and for the whole step `last_tokens`) is donated; static arguments are positional (4 to
        7): jit takes no keyword arguments with in_shardings. The forward half serves token masks the host
        fills while the forward pass runs.
        """
        options = self.compiler_options(step)
        key = tuple(sorted(options.items()))
        if key not in self._step_jits:
            if options:
                logger.info("step compile options: %s", cpu_step.describe(options))
            jit = functools.partial(jax.jit, static_argnums=(4, 5, 6, 7), compiler_options=options or None,
                                    **self._shardings)
            self._step_jits[key] = (jit(self._step_fn, donate_argnums=(1, 2)),
                                    jit(self._forward_fn, donate_argnums=(1,)))
        return self._step_jits[key]

    def attach_draft(self, draft: StepFollower | None) -> None:
        """Keep `draft`'s own pool in step with this one (None: detach): after each step's forward pass it
        runs over the same tokens and slots, and every copy-on-write copy is made in its pool too
        (`jaxpaged.spec_decode.draft_model`)."""
        if draft is not None and self.tp is not None:
            raise ValueError("speculative_config.method='draft_model' needs tensor_parallel_size=1")
        self._draft = draft

    def return_hidden_states(self, on: bool) -> None:
        """Whether each step also returns the last layer's hidden states (after the final norm) at its sample
        rows and verify rows, for a proposer that reads them (EAGLE-style). Fixed once a step has compiled."""
        if on != self._return_hidden_states and self._trace_count:
            raise ValueError("return_hidden_states must be set before the runner's first step compiles")
        self._return_hidden_states = on

    def _create_pool(self, kv_dtype, fill_value: float, k_scale, v_scale) -> KVPool:
        if self.tp is None:
            return create_pool(self.config, self.num_blocks, self.block_size, kv_dtype,
                               fill_value=fill_value, k_scale=k_scale, v_scale=v_scale)
        tp = self.tp
        if k_scale is not None:
            k_scale = tp.to_physical_heads(np.asarray(k_scale), axis=1)
            v_scale = tp.to_physical_heads(np.asarray(v_scale), axis=1)
        make = functools.partial(create_pool, tp.physical_config, self.num_blocks, self.block_size, kv_dtype,
                                 fill_value=fill_value, k_scale=k_scale, v_scale=v_scale)
        return jax.jit(make, out_shardings=self._pool_shardings())()  # each device allocates its heads only

    def _pool_shardings(self) -> KVPool:
        pages = (self.tp.pool_pages,) * num_pool_tensors(self.config)
        return KVPool(pages, pages, self.tp.pool_scales, self.tp.pool_scales)

    def _put(self, tree):
        """Host arrays onto the device (replicated over the mesh under tensor parallelism)."""
        if self.tp is None:
            return jax.device_put(tree)
        if jax.process_count() == 1:
            return jax.device_put(tree, self.tp.replicated)
        return self.tp.put_replicated(tree)  # every process holds the same host values

    @property
    def pool(self) -> KVPool:
        """The pool arrays (read-only: every change goes through the runner's methods)."""
        return self._pool

    @property
    def num_compiles(self) -> int:
        """Distinct step shapes compiled so far (or loaded from the persistent compile cache)."""
        return self._trace_count

    def _step_fn(self, params, pool: KVPool, last_tokens: jax.Array, inputs: DeviceStepInput,
                 layout: StepLayout, return_logits: bool, num_top_logprobs: int, num_prompt_top_logprobs: int):
        self._trace_count += 1  # runs once per trace, i.e. once per compiled shape
        out, pool, last_tokens, _ = self._run(params, pool, last_tokens, inputs, layout, return_logits,
                                              num_top_logprobs, num_prompt_top_logprobs, sample=True)
        return out, pool, last_tokens

    def _forward_fn(self, params, pool: KVPool, last_tokens: jax.Array, inputs: DeviceStepInput,
                    layout: StepLayout, return_logits: bool, num_top_logprobs: int, num_prompt_top_logprobs: int):
        """The step up to the logits to sample from (`_sample_fn` finishes it); the pool is donated."""
        self._trace_count += 1
        out, pool, _, processed = self._run(params, pool, last_tokens, inputs, layout, return_logits,
                                            num_top_logprobs, num_prompt_top_logprobs, sample=False)
        return out, pool, (out.pop("raw_logits"), processed)

    @staticmethod
    def _sample_fn(last_tokens: jax.Array, logits: tuple[jax.Array, jax.Array], sampling: SamplingBatch,
                   sample_rows: jax.Array, token_masks: TokenMasks):
        """Mask, sample, and keep each row's sample on the device (`last_tokens` donated).

        `logits` are the forward half's (raw, to choose from).
        """
        raw, processed = logits
        if token_masks.rows.shape[0]:
            processed = apply_token_bitmask(processed, token_masks)
        return _sample_and_keep(last_tokens, raw, processed, sampling, sample_rows)

    def _run(self, params, pool, last_tokens, inputs: DeviceStepInput, layout: StepLayout, return_logits: bool,
             num_top_logprobs: int, num_prompt_top_logprobs: int, *, sample: bool):
        """The traced step: forward pass, logit controls, token masks, then (with `sample`) sampling.

        Without `sample` it stops at the logits to choose from: the outputs
        carry the raw logits as "raw_logits" for `_sample_fn`.
        """
        logger.info("step shape %d: %d tokens, %d rows (%d decode), %d blocks per row, prefill chunk %d",
                    self._trace_count, inputs.token_ids.shape[0], inputs.attention.context_lens.shape[0],
                    layout.num_decode_seqs, inputs.attention.block_tables.shape[-1], layout.max_prefill_query_len)
        model = nnx.merge(self.graphdef, params)
        token_ids = _step_tokens(last_tokens, inputs.token_src_rows, inputs.token_ids)
        hidden, pool = model(token_ids, inputs.positions, pool, inputs.attention, layout, self.backend)
        logits = model.logits(hidden[inputs.logits_indices])
        processed = None
        if inputs.controls.bias_rows.shape[0] or inputs.controls.penalty_rows.shape[0]:
            processed = apply_logit_controls(logits.astype(jnp.float32), inputs.controls,
                                             token_ids[inputs.logits_indices])
        if inputs.token_masks.rows.shape[0]:  # structured output: only the constrained rows are touched
            processed = apply_token_bitmask(logits.astype(jnp.float32) if processed is None else processed,
                                            inputs.token_masks)
        out = {}
        if return_logits:
            out["logits"] = logits
        if num_top_logprobs:
            top_lp, top_ids = jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), num_top_logprobs)
            out["top_logprobs"], out["top_ids"] = top_lp, top_ids
        if inputs.prompt_logprob_rows.shape[0]:
            out.update(_prompt_logprobs(model, hidden, inputs, num_prompt_top_logprobs))
        if inputs.verify_rows.shape[0]:
            out.update(_verify(model, hidden, inputs))
        if self._return_hidden_states:
            out["hidden_states"] = hidden[inputs.logits_indices]
            out["verify_hidden_states"] = hidden[inputs.verify_rows]
        if not sample:
            out["raw_logits"] = logits
            return out, pool, last_tokens, logits.astype(jnp.float32) if processed is None else processed
        sampled, last_tokens = _sample_and_keep(last_tokens, logits, processed, inputs.sampling, inputs.sample_rows)
        return out | sampled, pool, last_tokens, processed

    # ---- the engine's entry point -------------------------------------------------------------

    def execute_model(self, scheduler_output: SchedulerOutput) -> PendingStep | _NoStep:
        """Apply the scheduler's changes, lay out its step and dispatch it; returns without waiting."""
        step = self.prepare_step(scheduler_output)
        if step is None:
            return _NoStep()
        if scheduler_output.token_masks_deferred:
            return self.dispatch_forward(step, num_top_logprobs=scheduler_output.num_top_logprobs)
        return self.dispatch(step, num_top_logprobs=scheduler_output.num_top_logprobs)

    def reset(self) -> None:
        """Forget every row of the persistent batch (the pool and compiled steps are kept)."""
        self.input_batch = InputBatch(self.block_size, self.input_batch.capacity, self.kv_layout.windows,
                                      min_decode_rows=self.min_decode_rows)

    def prepare_step(self, scheduler_output: SchedulerOutput) -> StepInput | None:
        """Update the persistent batch, make the copy-on-write copies, and lay out the step (None: empty)."""
        self.input_batch.apply(scheduler_output)
        if scheduler_output.copies:
            self.copy_blocks(scheduler_output.copies)
        if not scheduler_output.seqs:
            return None
        with jax.profiler.TraceAnnotation("layout_inputs"):
            return self.input_batch.prepare(scheduler_output)

    def dispatch(self, step: StepInput, *, return_logits: bool = False, num_top_logprobs: int = 0) -> PendingStep:
        """Start one step on the device; the handle's `result()` waits for it."""
        inputs = self._device_inputs(step)
        self._fit_last_tokens()
        with jax.profiler.TraceAnnotation("dispatch_step"):
            inputs = self._put(inputs)
            draft_tokens = self._draft_tokens(inputs)  # before the step donates `last_tokens`
            out, self._pool, self._last_tokens = self._jitted(step)[0](
                self.params, self._pool, self._last_tokens, inputs, step.layout, return_logits, num_top_logprobs,
                step.num_prompt_top_logprobs)
        self._draft_catch_up(draft_tokens, inputs, step.layout)
        return PendingStep(out, step.order)

    def dispatch_forward(self, step: StepInput, *, num_top_logprobs: int = 0) -> MaskPendingStep:
        """Start a step's forward pass; its handle's `sample(...)` dispatches the sampling with token masks."""
        inputs = self._device_inputs(step)
        self._fit_last_tokens()
        with jax.profiler.TraceAnnotation("dispatch_forward"):
            inputs = self._put(inputs)
            draft_tokens = self._draft_tokens(inputs)
            out, self._pool, logits = self._jitted(step)[1](
                self.params, self._pool, self._last_tokens, inputs, step.layout, False, num_top_logprobs,
                step.num_prompt_top_logprobs)
        self._draft_catch_up(draft_tokens, inputs, step.layout)
        return MaskPendingStep(self, out, logits, inputs, step.order)

    def _draft_tokens(self, inputs: DeviceStepInput) -> jax.Array | None:
        """The step's input tokens on the device for the draft model (None without one): with overlapped
        steps a decode's input is the token the previous step sampled, which only the device knows yet."""
        if self._draft is None:
            return None
        return self._resolve_tokens(self._last_tokens, inputs.token_src_rows, inputs.token_ids)

    def _draft_catch_up(self, token_ids: jax.Array | None, inputs: DeviceStepInput, layout: StepLayout) -> None:
        """The draft model computes its K/V for the step's tokens (`_draft_tokens`) at the step's slots."""
        if self._draft is not None:
            with jax.profiler.TraceAnnotation("draft_catch_up"):
                self._draft.catch_up(token_ids, inputs.positions, inputs.attention, layout)

    def _dispatch_sample(self, logits, inputs: DeviceStepInput, masks: TokenMasks) -> dict[str, jax.Array]:
        with jax.profiler.TraceAnnotation("dispatch_sample"):
            out, self._last_tokens = self._sample(self._last_tokens, logits, inputs.sampling, inputs.sample_rows,
                                                  self._put(masks))
        return out

    def execute(self, step: StepInput, *, return_logits: bool = False, num_top_logprobs: int = 0) -> ModelOutput:
        """Run one hand-built step to completion and bring back its sampled tokens (and logits if asked)."""
        return self.dispatch(step, return_logits=return_logits, num_top_logprobs=num_top_logprobs).result()

    def lower(self, step: StepInput, *, return_logits: bool = False, num_top_logprobs: int = 0):
        """The jitted step lowered for `step`'s shapes (`.compile().as_text()` shows the optimised HLO)."""
        inputs = self._put(self._device_inputs(step))
        return self._jitted(step)[0].lower(self.params, self._pool, self._last_tokens, inputs, step.layout,
                                           return_logits, num_top_logprobs, step.num_prompt_top_logprobs)

    def _fit_last_tokens(self) -> None:
        """Grow the device copy of each row's last sample with the persistent batch (old rows kept)."""
        grow = self.input_batch.capacity - self._last_tokens.shape[0]
        if grow > 0:
            self._last_tokens = jnp.concatenate([self._last_tokens, self._put(np.zeros(grow, np.int32))])

    @staticmethod
    def _device_inputs(step: StepInput) -> DeviceStepInput:
        step.check_shapes()
        return DeviceStepInput(
            token_ids=step.token_ids,
            token_src_rows=step.token_src_rows,
            positions=step.positions,
            attention=AttentionBatch(step.slot_mapping, step.block_tables, step.context_lens,
                                     step.query_start, step.query_lens),
            logits_indices=step.logits_indices,
            sampling=SamplingBatch(step.temperature, step.top_k, step.top_p, step.seeds, step.counters,
                                   step.min_p),
            sample_rows=step.sample_rows,
            controls=step.logit_controls if step.logit_controls is not None else empty_controls(),
            token_masks=step.token_masks if step.token_masks is not None else empty_token_masks(),
            prompt_logprob_rows=_or_empty(step.prompt_logprob_rows),
            prompt_logprob_targets=_or_empty(step.prompt_logprob_targets),
            verify_rows=_or_empty(step.verify_rows),
            verify_drafts=_or_empty(step.verify_drafts),
            verify_seq_rows=_or_empty(step.verify_seq_rows),
            verify_counters=_or_empty(step.verify_counters),
        )

    # ---- the pool -------------------------------------------------------------------------------

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Apply copy-on-write block copies (src -> dst) to the pool, in place."""
        if not pairs:
            return
        size = next_power_of_two(len(pairs))  # pad: few compiles
        src = np.zeros(size, np.int32)
        dst = np.full(size, self.num_blocks, np.int32)  # out of range = dropped
        src[:len(pairs)], dst[:len(pairs)] = zip(*pairs)
        self._pool = copy_blocks(self._pool, src, dst)
        if self._draft is not None:
            self._draft.copy_blocks(src, dst)

    def start_read_blocks(self, block_ids: Sequence[int]) -> _PendingBlocks:
        """Dispatch one gather of the given blocks and start its copy to the host."""
        return _PendingBlocks(start_gather(self._pool, list(block_ids)), len(block_ids), self._logical_block)

    def read_blocks(self, block_ids: Sequence[int]) -> list[np.ndarray]:
        """Host copies of the given blocks, one `[2, L, Hkv, B, D]` array per block (logical KV heads)."""
        return self.start_read_blocks(block_ids).result() if block_ids else []

    def write_blocks(self, block_ids: Sequence[int], blocks: Sequence[np.ndarray]) -> None:
        """Overwrite the given pool blocks with host data, in one transfer and one donated scatter."""
        physical = [self._physical_block(np.asarray(b).astype(self.kv_dtype, copy=False)) for b in blocks]
        self._pool = scatter_blocks(self._pool, list(block_ids), physical)

    def warm_read_blocks(self, max_blocks: int) -> None:
        """Compile the block gather for every padded count up to `max_blocks` blocks (reads block 0)."""
        for count in padded_counts(max_blocks):
            self.start_read_blocks([0] * count)  # the compile happens at dispatch; the copy is not waited for

    def warm_write_blocks(self, max_blocks: int) -> None:
        """Compile the block scatter for every padded count up to `max_blocks` blocks; writes nothing (every
        id is out of range, and the scatter drops out-of-range rows as it drops its padding)."""
        block = np.zeros(self.kv_block_shape, self.kv_dtype)
        for count in padded_counts(max_blocks):
            self.write_blocks([self.num_blocks] * count, [block] * count)

    def _logical_block(self, block: np.ndarray) -> np.ndarray:
        return block if self.tp is None else self.tp.to_logical_heads(block, axis=2)

    def _physical_block(self, block: np.ndarray) -> np.ndarray:
        return block if self.tp is None else self.tp.to_physical_heads(block, axis=2)

    def kv_scales(self) -> tuple[np.ndarray, np.ndarray]:
        """The pool's fp8 scales `(k_scale, v_scale)` on the host, `[L, Hkv]` (logical KV heads)."""
        k, v = np.asarray(self._pool.k_scale), np.asarray(self._pool.v_scale)
        if self.tp is None:
            return k, v
        return self.tp.to_logical_heads(k, axis=1), self.tp.to_logical_heads(v, axis=1)

    def set_kv_scales(self, k_scale: np.ndarray, v_scale: np.ndarray) -> None:
        """Replace the pool's fp8 scales (scales are pool data: no recompile)."""
        k = np.asarray(k_scale, np.float32)
        v = np.asarray(v_scale, np.float32)
        if self.tp is None:
            self._pool = self._pool._replace(k_scale=jnp.asarray(k), v_scale=jnp.asarray(v))
            return
        put = functools.partial(self.tp.put, sharding=self.tp.pool_scales)
        self._pool = self._pool._replace(k_scale=put(self.tp.to_physical_heads(k, axis=1)),
                                         v_scale=put(self.tp.to_physical_heads(v, axis=1)))

    def calibrate_kv_scales(self, token_ids: Sequence[int], margin: float) -> None:
        """Set fp8 scales from running `token_ids` once through a float32 pool (see `calibrate_kv_scales`)."""
        model = nnx.merge(self.graphdef, self.params)  # the sharded model: KV heads as the pool holds them
        size = 1 if self.tp is None else self.tp.size
        k, v = calibrate_kv_scales(model, list(token_ids), self.block_size, margin, tensor_parallel_size=size)
        if self.tp is not None:
            k, v = self.tp.to_logical_heads(k, axis=1), self.tp.to_logical_heads(v, axis=1)
        self.set_kv_scales(k, v)


def calibrate_kv_scales(model: DecoderModel, token_ids: list[int], block_size: int,
                        margin: float = DEFAULT_SCALE_MARGIN, *, tensor_parallel_size: int = 1
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Run `token_ids` once through a float32 pool sized for them; return fp8 `(k_scale, v_scale)`.

    The pool starts at zero, so its absmax is exactly the prompt's K/V absmax.
    """
    if not token_ids:
        raise ValueError("fp8 calibration needs at least one token")
    layout = kv_cache_layout(model.config.layer_windows)
    num_blocks = cdiv(len(token_ids), block_size) * layout.num_groups  # a table per KV cache group
    runner = ModelRunner(model, num_blocks, block_size, kv_dtype=jnp.float32,
                         tensor_parallel_size=tensor_parallel_size)
    runner.execute(build_step_input([ScheduledSeq(list(token_ids), 0, list(range(num_blocks)))], block_size,
                                    layout.num_groups))
    # per pool tensor; a tensor shared by several groups' layers gives them all its (largest) absmax
    k_absmax, v_absmax = (a[list(layout.layer_tensor)] for a in pool_absmax(runner.pool))
    return scales_from_absmax(k_absmax, margin), scales_from_absmax(v_absmax, margin)
