"""`EngineBuilder`: everything an engine is made of, assembled once from an `EngineConfig`.

    config ─► model + weights ─► runner (TP mesh, pool, fp8 scales) ─► KV manager (paged | contiguous)
           ─► lower tiers ─► scheduler ─► input / output processors ─► EngineParts

`Engine(config, ...)` calls it and then only loops over the parts; a snapshot
named by `prefix_cache_snapshot` is restored into the finished engine
(`restore_prefix_cache_at_start`). The split follows vLLM's `EngineCore`
(whose constructor builds the executor, KV caches and scheduler before its
`step` loop runs) and nano-vllm's `LLMEngine`: construction decides every
shape and part, so the loop never asks which kind of part it holds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from jaxpaged import compile_cache
from jaxpaged.attention import resolve_backend
from jaxpaged.cache import KVCacheManager, KVManager
from jaxpaged.cache.kv_groups import KVCacheLayout, kv_cache_layout
from jaxpaged.engine.config import EngineConfig
from jaxpaged.engine.input_processor import InputProcessor
from jaxpaged.engine.output_processor import OutputProcessor
from jaxpaged.engine.parts import EngineParts
from jaxpaged.kv_pool.fp8 import validate_kv_scales
from jaxpaged.kv_pool.pool import kv_dtype_from_name
from jaxpaged.model import DecoderModel
from jaxpaged.offload.setup import build_tiers
from jaxpaged.runner import KVPoolRunner, ModelRunner, Runner
from jaxpaged.scheduler import Scheduler, SchedulerConfig
from jaxpaged.spec_decode import make_proposer


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
    ):
        """`model` skips loading `config.model`; `runner` replaces the device (e.g. a simulator).

        A given runner must have the configured block size and block count
        (ValueError otherwise); without `num_blocks` or `kv_cache_bytes` in the
        config, the runner's block count is taken.
        """
        self.config = config
        self.clock = clock
        self._model = model
        self._tokenizer = tokenizer
        self._runner = runner

    def build(self) -> EngineParts:
        """Load the model (unless given or simulated), then size and build every part."""
        config, runner, model = self.config, self._runner, self._model
        compile_cache.configure(config.compile_cache_dir)  # before the first compile (the model's init)
        if runner is None and model is None:
            from jaxpaged.checkpoint import load_model
            model = load_model(config.model, dtype=config.dtype, seed=config.seed,
                               tensor_parallel_size=config.tensor_parallel_size)
        self.model_config = runner.config if runner is not None else model.config
        kv_dtype = kv_dtype_from_name(config.kv_cache_dtype, config.dtype or self.model_config.dtype)
        if runner is not None and config.num_blocks is None and config.kv_cache_bytes is None:
            self.num_blocks = runner.num_blocks
        else:
            self.num_blocks = config.resolve_num_blocks(self.model_config, kv_dtype)
        self.block_size = config.block_size
        self.max_model_len = min(config.max_model_len or self.model_config.max_position_embeddings,
                                 self.num_blocks * self.block_size)
        kv_scales = None
        if config.kv_scales is not None:
            kv_scales = validate_kv_scales(self.model_config, config.kv_scales)
        calibrate_kv_scales = (runner is None and kv_scales is None
                               and np.dtype(kv_dtype) == np.dtype("float8_e4m3fn"))
        if runner is None:
            backend = resolve_backend(config.attention_backend, interpret=config.pallas_interpret)
            runner = ModelRunner(model, self.num_blocks, self.block_size, kv_dtype=kv_dtype, backend=backend,
                                 pool_fill_value=config.pool_fill_value, kv_scales=kv_scales,
                                 max_num_seqs=config.max_num_seqs,
                                 tensor_parallel_size=config.tensor_parallel_size)
        self._check_runner(runner)
        runner.reset()  # a runner reused from an earlier engine keeps none of its rows
        self.runner = runner
        layout = kv_cache_layout(self.model_config.layer_windows)
        self.kv: KVManager = self._make_kv_manager(layout)
        # a decode engine's pulled blocks land in the host tier: one pool's worth unless host_cache_bytes says
        tiers = build_tiers(config, self.kv, runner, host_cache_bytes=(
            self.num_blocks * _block_bytes(runner) if config.kv_role in ("decode", "both") else None))
        scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, config.preemption_mode,
                            config.scheduling_policy),
            self.kv, tiers, clock=self.clock,
            proposer=make_proposer(config.speculative_config) if config.speculative_config else None,
            disable_speculation_at=config.speculative_config and config.speculative_config.disable_by_batch_size)
        input_processor = InputProcessor(
            self.model_config, max_model_len=self.max_model_len, num_blocks=self.num_blocks,
            block_size=self.block_size, load_tokenizer=self._load_tokenizer, seed=config.seed,
            # KV cache groups: a sliding group's blocks slide out, so none are counted as shared between forks
            blocks_for_tokens=self.kv.max_blocks_for if layout.is_hybrid and config.kv_layout == "paged" else None,
            computes_logits=getattr(runner, "computes_logits", True),
            samples_under_token_masks=getattr(runner, "samples_under_token_masks",
                                              getattr(runner, "computes_logits", True)),
            speculative=config.speculative_config is not None)
        parts = EngineParts(
            config=config, clock=self.clock, model_config=self.model_config, num_blocks=self.num_blocks,
            block_size=self.block_size, max_model_len=self.max_model_len, runner=runner, kv=self.kv,
            tiers=tiers, scheduler=scheduler, input_processor=input_processor,
            output_processor=OutputProcessor(lambda: input_processor.tokenizer),
            calibrate_kv_scales=calibrate_kv_scales, kv_connector=_build_kv_connector(config, self.kv, runner, tiers))
        if not calibrate_kv_scales:
            tie_disk_tier_to_identity(parts)
        return parts

    def _check_runner(self, runner: Runner) -> None:
        if runner.block_size != self.block_size:
            raise ValueError(f"the runner's block_size ({runner.block_size}) differs from "
                             f"EngineConfig.block_size ({self.block_size})")
        if runner.num_blocks != self.num_blocks:
            raise ValueError(f"the runner's pool has {runner.num_blocks} blocks; the engine's config "
                             f"asks for {self.num_blocks} (num_blocks / kv_cache_bytes)")
        owns_pool = isinstance(runner, KVPoolRunner)
        if self.config.host_cache_bytes is not None and not owns_pool:
            raise ValueError("host_cache_bytes needs a runner that owns a device KV pool (ModelRunner)")
        if self.config.speculative_config is not None and not isinstance(runner, ModelRunner):
            raise ValueError("speculative_config needs the model runner (its step verifies the draft tokens); "
                             f"got {type(runner).__name__}")
        if self.config.prefix_cache_snapshot and not owns_pool:
            raise ValueError("prefix_cache_snapshot needs a runner that owns a device KV pool (ModelRunner)")
        if jax.process_count() > 1 and (self.config.host_cache_bytes is not None
                                        or self.config.prefix_cache_snapshot or self.config.kv_role != "none"):
            raise ValueError("host_cache_bytes, prefix_cache_snapshot and kv_role are single-process only: with "
                             f"{jax.process_count()} processes no process can read a whole pool block")

    def _make_kv_manager(self, layout: KVCacheLayout) -> KVManager:
        if self.config.kv_layout == "contiguous":  # the all-layers-full baseline, one region per group
            from jaxpaged.cache.contiguous import ContiguousKVCacheManager
            region_len = (self.num_blocks // layout.num_groups) * self.block_size
            self.max_model_len = min(self.max_model_len, region_len)
            return ContiguousKVCacheManager(self.num_blocks, self.block_size, max_model_len=self.max_model_len,
                                            num_groups=layout.num_groups)
        kv = KVCacheManager(self.num_blocks, self.block_size, layout,
                            enable_prefix_caching=self.config.enable_prefix_caching,
                            hash_algo=self.config.hash_algo, max_chunk_tokens=self.config.max_num_batched_tokens,
                            eviction_policy=self.config.eviction_policy, clock=self.clock)
        if self.config.kv_cache_metrics_sample > 0:
            kv.track_residency(self.config.kv_cache_metrics_sample)
        # A sliding group holds ~W tokens, not the whole context: the pool bounds a sequence through every group.
        self.max_model_len = _longest_that_fits(
            kv, self.config.max_model_len or self.model_config.max_position_embeddings)
        return kv

    def _load_tokenizer(self):
        if self._tokenizer is not None:
            return self._tokenizer
        from jaxpaged.tokenizer import load_tokenizer
        return load_tokenizer(self.config.model, self.model_config)


def _longest_that_fits(kv: KVCacheManager, limit: int) -> int:
    """The longest sequence (at most `limit`) whose blocks in every KV cache group fit the pool."""
    low, high = 0, limit  # can_fit(low) holds; find the largest such length by bisection
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if kv.can_fit(mid) else (low, mid - 1)
    return low


def tie_disk_tier_to_identity(parts: EngineParts) -> None:
    """Disk-tier files and KV transfers are tied to the engine's identity (model, weights, layout, final fp8
    scales)."""
    has_disk = parts.tiers is not None and parts.tiers.disk is not None
    if has_disk or parts.kv_connector is not None:
        from jaxpaged.snapshot import engine_identity, identity_digest
        identity = identity_digest(engine_identity(parts))
        if has_disk:
            parts.tiers.set_format(identity)
        if parts.kv_connector is not None:
            parts.kv_connector.set_identity(identity)


def _block_bytes(runner) -> int:
    return int(np.prod(runner.kv_block_shape)) * np.dtype(runner.kv_dtype).itemsize


def _build_kv_connector(config: EngineConfig, kv, runner, tiers):
    """The KV connector of `config.kv_role` (None for "none"); needs a runner that owns a device pool."""
    if config.kv_role == "none":
        return None
    if not isinstance(runner, KVPoolRunner):
        raise ValueError("kv_role needs a runner that owns a device KV pool (ModelRunner)")
    from jaxpaged.kv_transfer import PeerKVConnector
    peers = tuple(p.strip() for p in (config.kv_peers or "").split(",") if p.strip())
    return PeerKVConnector(config.kv_role, kv, runner, tiers.host if tiers is not None else None,
                           transport=config.kv_transport, listen=config.kv_listen, peers=peers,
                           outbox_blocks=config.kv_outbox_blocks, timeout_s=config.kv_transfer_timeout_s,
                           serve_delay_s=config.kv_serve_delay_s)


def restore_prefix_cache_at_start(engine) -> None:
    """Restore `prefix_cache_snapshot` into a just-built engine; absent: a first start, nothing to restore."""
    path = engine.config.prefix_cache_snapshot
    if path and Path(path).exists():
        engine.load_prefix_cache(path)
