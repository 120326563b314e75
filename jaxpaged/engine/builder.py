"""`EngineBuilder`: everything an engine is made of, assembled once from an `EngineConfig`.

    config ─► model + weights ─► runner (TP mesh, pool, fp8 scales) ─► KV manager (paged | contiguous)
           ─► lower tiers ─► scheduler ─► input / output processors ─► EngineParts

`Engine(config, ...)` calls it and then only loops over the parts. `build` is
a function of the builder's inputs: it writes nothing back, and every number
it settles (the pool's block count, the effective `max_model_len`) is
returned in the `EngineParts`. What the runner can do is read from its
declared `capabilities`, never probed. The split follows vLLM's `EngineCore`
(whose constructor builds the executor, KV caches and scheduler before its
`step` loop runs) and nano-vllm's `LLMEngine`: construction decides every
shape and part, so the loop never asks which kind of part it holds.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import jax
import numpy as np

from jaxpaged import compile_cache
from jaxpaged.attention import resolve_backend
from jaxpaged.cache import KVCacheManager, KVManager
from jaxpaged.cache.kv_groups import KVCacheLayout, kv_cache_layout
from jaxpaged.config import ModelConfig
from jaxpaged.engine.config import EngineConfig
from jaxpaged.engine.input_processor import InputProcessor
from jaxpaged.engine.output_processor import OutputProcessor
from jaxpaged.engine.parts import EngineParts
from jaxpaged.kv_pool.fp8 import validate_kv_scales
from jaxpaged.kv_pool.pool import kv_dtype_from_name
from jaxpaged.model import DecoderModel
from jaxpaged.offload.setup import build_tiers
from jaxpaged.offload.tiers import KVTiers
from jaxpaged.runner import ModelRunner, Runner
from jaxpaged.runner.buckets import MIN_DECODE_BLOCKS_PER_SEQ
from jaxpaged.scheduler import Scheduler, SchedulerConfig
from jaxpaged.snapshot import tie_disk_tier_to_identity
from jaxpaged.spec_decode import Proposer, make_proposer


class EngineBuilder:
    """Builds an engine's parts from a validated `EngineConfig` (cross-checks with the model and runner here)."""

    def __init__(
        self,
        config: EngineConfig,
        model: DecoderModel | None = None,
        *,
        tokenizer=None,
        runner: Runner | None = None,
        clock: Callable[[], float] = time.monotonic,
        proposer: Proposer | None = None,
    ):
        """`model` skips loading `config.model`; `runner` replaces the device (e.g. a simulator).

        A given runner must have the configured block size and block count
        (ValueError otherwise); without `num_blocks` or `kv_cache_bytes` in the
        config, the runner's block count is taken. `proposer` replaces the one
        `speculative_config.method` names (which must be set): a proposer built
        by the caller, e.g. an EAGLE-style head over the target's hidden states.
        """
        if proposer is not None and config.speculative_config is None:
            raise ValueError("a proposer needs speculative_config (k, disable_by_batch_size, the checks it implies)")
        self.config = config
        self.clock = clock
        self.model = model
        self.tokenizer = tokenizer
        self.runner = runner
        self.proposer = proposer

    def build(self) -> EngineParts:
        """Load the model (unless given or simulated), then size and build every part (the builder is unchanged)."""
        config, given_runner, model = self.config, self.runner, self.model
        compile_cache.configure(config.compile_cache_dir)  # before the first compile (the model's init)
        if given_runner is None and model is None:
            from jaxpaged.checkpoint import load_model
            model = load_model(config.model, dtype=config.dtype, seed=config.seed,
                               tensor_parallel_size=config.tensor_parallel_size)
        model_config = given_runner.config if given_runner is not None else model.config
        kv_dtype = kv_dtype_from_name(config.kv_cache_dtype, config.dtype or model_config.dtype)
        if given_runner is not None and config.num_blocks is None and config.kv_cache_bytes is None:
            num_blocks = given_runner.num_blocks
        else:
            num_blocks = config.resolve_num_blocks(model_config, kv_dtype)
        kv_scales = validate_kv_scales(model_config, config.kv_scales) if config.kv_scales is not None else None
        calibrate_kv_scales = (given_runner is None and kv_scales is None
                               and np.dtype(kv_dtype) == np.dtype("float8_e4m3fn"))
        runner = given_runner if given_runner is not None else _model_runner(config, model, num_blocks, kv_dtype,
                                                                              kv_scales)
        _check_runner(config, runner, num_blocks)
        runner.reset()  # a runner reused from an earlier engine keeps none of its rows
        proposer = _proposer(config, runner, self.proposer, model_config, num_blocks, kv_dtype)
        layout = kv_cache_layout(model_config.layer_windows)
        kv, max_model_len = _kv_manager(config, layout, num_blocks, model_config, self.clock)
        # a decode engine's pulled blocks land in the host tier: one pool's worth unless host_cache_bytes says
        tiers = build_tiers(config, kv, runner, host_cache_bytes=(
            num_blocks * _block_bytes(runner) if config.kv_role in ("decode", "both") else None))
        capabilities = runner.capabilities
        input_processor = InputProcessor(
            model_config, max_model_len=max_model_len, num_blocks=num_blocks, block_size=config.block_size,
            load_tokenizer=functools.partial(_load_tokenizer, config.model, model_config, self.tokenizer),
            seed=config.seed,
            # KV cache groups: a sliding group's blocks slide out, so none are counted as shared between forks
            blocks_for_tokens=kv.max_blocks_for if layout.is_hybrid and config.kv_layout == "paged" else None,
            computes_logits=capabilities.computes_logits,
            samples_under_token_masks=capabilities.samples_under_token_masks,
            speculative=config.speculative_config is not None)
        parts = EngineParts(
            config=config, clock=self.clock, model_config=model_config, num_blocks=num_blocks,
            block_size=config.block_size, max_model_len=max_model_len, runner=runner, kv=kv, tiers=tiers,
            scheduler=_scheduler(config, kv, tiers, self.clock, proposer), input_processor=input_processor,
            output_processor=OutputProcessor(lambda: input_processor.tokenizer),
            calibrate_kv_scales=calibrate_kv_scales,
            kv_connector=_kv_connector(config, kv, runner, tiers, max_model_len))
        if not calibrate_kv_scales:  # the identity is final now (else after calibration or a snapshot's scales)
            tie_disk_tier_to_identity(parts)
        return parts


def _model_runner(config: EngineConfig, model: DecoderModel, num_blocks: int, kv_dtype,
                  kv_scales: tuple[np.ndarray, np.ndarray] | None) -> ModelRunner:
    """The device runner over a pool of `num_blocks` blocks, with the configured attention backend."""
    backend = resolve_backend(config.attention_backend, interpret=config.pallas_interpret)
    return ModelRunner(model, num_blocks, config.block_size, kv_dtype=kv_dtype, backend=backend,
                       pool_fill_value=config.pool_fill_value, kv_scales=kv_scales,
                       max_num_seqs=config.max_num_seqs, tensor_parallel_size=config.tensor_parallel_size,
                       cpu_compiler_options=config.cpu_compiler_options, cpu_gemm=config.cpu_gemm)


def _check_runner(config: EngineConfig, runner: Runner, num_blocks: int) -> None:
    """ValueError where the runner's shape or declared capabilities do not fit what the config asks."""
    if runner.block_size != config.block_size:
        raise ValueError(f"the runner's block_size ({runner.block_size}) differs from "
                         f"EngineConfig.block_size ({config.block_size})")
    if runner.num_blocks != num_blocks:
        raise ValueError(f"the runner's pool has {runner.num_blocks} blocks; the engine's config "
                         f"asks for {num_blocks} (num_blocks / kv_cache_bytes)")
    capabilities = runner.capabilities
    if config.host_cache_bytes is not None and not capabilities.moves_blocks:
        raise ValueError(f"host_cache_bytes needs a runner whose blocks the tiers can move (ModelRunner); "
                         f"got {type(runner).__name__}")
    needs_pool = [name for name, wanted in (("prefix_cache_snapshot", bool(config.prefix_cache_snapshot)),
                                            ("kv_role", config.kv_role != "none")) if wanted]
    if needs_pool and not capabilities.owns_kv_pool:
        raise ValueError(f"{needs_pool[0]} needs a runner that owns a device KV pool (ModelRunner); "
                         f"got {type(runner).__name__}")
    if config.speculative_config is not None and not capabilities.verifies_drafts:
        raise ValueError("speculative_config needs the model runner (its step verifies the draft tokens); "
                         f"got {type(runner).__name__}")
    if jax.process_count() > 1 and (needs_pool or config.host_cache_bytes is not None):
        raise ValueError("host_cache_bytes, prefix_cache_snapshot and kv_role are single-process only: with "
                         f"{jax.process_count()} processes no process can read a whole pool block")


def _kv_manager(config: EngineConfig, layout: KVCacheLayout, num_blocks: int, model_config: ModelConfig,
                clock: Callable[[], float]) -> tuple[KVManager, int]:
    """The KV cache manager of `config.kv_layout`, and the longest sequence it can hold (the effective
    `max_model_len`: at most the configured or the model's, and what the pool fits)."""
    limit = config.max_model_len or model_config.max_position_embeddings
    if config.kv_layout == "contiguous":  # the all-layers-full baseline, one region per group
        from jaxpaged.cache.contiguous import ContiguousKVCacheManager
        region_len = (num_blocks // layout.num_groups) * config.block_size
        max_model_len = min(limit, region_len)
        return ContiguousKVCacheManager(num_blocks, config.block_size, max_model_len=max_model_len,
                                        num_groups=layout.num_groups), max_model_len
    kv = KVCacheManager(num_blocks, config.block_size, layout, enable_prefix_caching=config.enable_prefix_caching,
                        hash_algo=config.hash_algo, max_chunk_tokens=config.max_num_batched_tokens,
                        eviction_policy=config.eviction_policy, clock=clock)
    if config.kv_cache_metrics_sample > 0:
        kv.track_residency(config.kv_cache_metrics_sample)
    # A sliding group holds ~W tokens, not the whole context: the pool bounds a sequence through every group.
    return kv, _longest_that_fits(kv, limit)


def _longest_that_fits(kv: KVCacheManager, limit: int) -> int:
    """The longest sequence (at most `limit`) whose blocks in every KV cache group fit the pool."""
    low, high = 0, limit  # can_fit(low) holds; find the largest such length by bisection
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if kv.can_fit(mid) else (low, mid - 1)
    return low


def _scheduler(config: EngineConfig, kv: KVManager, tiers: KVTiers | None, clock: Callable[[], float],
               proposer: Proposer | None) -> Scheduler:
    """The scheduler over `kv` and `tiers`, with the configured policy and speculative proposer."""
    speculative = config.speculative_config
    return Scheduler(
        SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, config.preemption_mode,
                        config.scheduling_policy),
        kv, tiers, clock=clock, proposer=proposer,
        disable_speculation_at=speculative and speculative.disable_by_batch_size)


def _proposer(config: EngineConfig, runner: Runner, given: Proposer | None, model_config: ModelConfig,
              num_blocks: int, kv_dtype) -> Proposer | None:
    """The proposer of `speculative_config` (None: off), or the `given` one; a draft model gets its pool
    beside the runner's (the same block ids)."""
    spec = config.speculative_config
    owns_pool = runner.capabilities.owns_kv_pool
    if owns_pool:
        runner.attach_draft(None)  # a runner reused from an earlier engine drops that engine's draft
        runner.return_hidden_states(given is not None and given.uses_hidden_states)
    if given is not None:
        if given.uses_hidden_states and not owns_pool:
            raise ValueError(f"a proposer of hidden states needs the model runner; got {type(runner).__name__}")
        return given
    if spec is None or spec.method != "draft_model":
        return make_proposer(spec) if spec is not None else None
    if not owns_pool:
        raise ValueError(f"speculative_config method 'draft_model' needs the model runner; got {type(runner).__name__}")
    from jaxpaged.spec_decode.draft_model import load_draft_proposer
    draft_kv_dtype = None if np.dtype(kv_dtype) == np.dtype("float8_e4m3fn") else kv_dtype  # no draft scales
    draft = load_draft_proposer(
        spec.model, model_config, spec.num_speculative_tokens, num_blocks, config.block_size,
        dtype=config.dtype, seed=config.seed, kv_dtype=draft_kv_dtype, backend=runner.backend,
        pool_fill_value=config.pool_fill_value, min_table_blocks=MIN_DECODE_BLOCKS_PER_SEQ)
    runner.attach_draft(draft)
    return draft


def _load_tokenizer(model_name: str, model_config: ModelConfig, given=None):
    """The given tokenizer, else the checkpoint's (bytes when it has none)."""
    if given is not None:
        return given
    from jaxpaged.tokenizer import load_tokenizer
    return load_tokenizer(model_name, model_config)


def _block_bytes(runner) -> int:
    return int(np.prod(runner.kv_block_shape)) * np.dtype(runner.kv_dtype).itemsize


def _kv_connector(config: EngineConfig, kv: KVManager, runner, tiers: KVTiers | None, max_model_len: int):
    """The KV connector of `config.kv_role` (None for "none"), its block moves compiled for one request of
    `max_model_len` tokens; `_check_runner` has made sure the runner owns a device pool."""
    if config.kv_role == "none":
        return None
    from jaxpaged.kv_transfer import PeerKVConnector
    peers = tuple(p.strip() for p in (config.kv_peers or "").split(",") if p.strip())
    connector = PeerKVConnector(config.kv_role, kv, runner, tiers,
                                transport=config.kv_transport, listen=config.kv_listen, peers=peers,
                                outbox_blocks=config.kv_outbox_blocks, timeout_s=config.kv_transfer_timeout_s,
                                serve_delay_s=config.kv_serve_delay_s)
    connector.warm_up(max_model_len)
    return connector
