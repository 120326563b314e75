"""The engine: a thin loop over explicit parts.

    step():  schedule  ->  dispatch the device step  ->  process outputs  ->  emit outputs
             Scheduler     Runner.execute_model          Scheduler.update_from_output
                                                                            OutputProcessor

With `async_scheduling` (the default) the host schedules and lays out step N+1
and dispatches it before it reads step N's tokens; N's outputs are processed
while N+1 runs on the device, and the tokens N sampled are N+1's inputs
straight from the device. Beam search needs each step's tokens before the next
is scheduled, so the engine runs synchronously while a beam request is live.

`Engine` is the low-level API benchmarks and servers drive (`add_request`,
`step`, `abort`, `has_unfinished_requests`); `jaxpaged.llm.LLM` wraps it for
offline batches.
"""

from __future__ import annotations

import itertools
import time
from typing import Callable
from typing import Sequence as Seq

import jax
import numpy as np

from jaxpaged import compile_cache
from jaxpaged.attention import resolve_backend
from jaxpaged.cache import KVCacheManager, KVManager
from jaxpaged.cache.hybrid_manager import HybridKVCacheManager
from jaxpaged.cache.kv_groups import kv_cache_layout
from jaxpaged.engine.config import EngineConfig
from jaxpaged.engine.input_processor import InputProcessor
from jaxpaged.engine.output_processor import OutputProcessor
from jaxpaged.kv.fp8 import validate_kv_scales
from jaxpaged.kv.pool import kv_dtype_from_name
from jaxpaged.model import LlamaModel
from jaxpaged.offload.setup import build_tiers
from jaxpaged.outputs import RequestOutput
from jaxpaged.runner import KVPoolRunner, ModelRunner, Runner, StepHandle
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.scheduler import Scheduler, SchedulerConfig, SchedulerOutput, SchedulerStats
from jaxpaged.sequence import Request
from jaxpaged.validation import check_float, check_str

MAX_PIN_TTL_S = 7 * 24 * 3600.0  # a pin outlives no week: pinned blocks must not become a leak


class Engine:
    """Continuous-batching engine over one model and one paged KV pool."""

    def __init__(
        self,
        config: EngineConfig,
        model: LlamaModel | None = None,
        *,
        tokenizer=None,
        runner: Runner | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """Build the engine; `runner` replaces the device (e.g. a simulator), `clock` the time source.

        A given runner must have the configured block size and block count
        (ValueError otherwise); without `num_blocks` or `kv_cache_bytes` in the
        config, the runner's block count is taken.
        """
        compile_cache.configure(config.compile_cache_dir)  # before the first compile (the model's init)
        self.config = config
        self.clock = clock
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
        # fp8 without given scales: calibrate on the first prefill, before anything is written
        self._calibrate_kv_scales = (runner is None and kv_scales is None
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
        self.kv: KVManager = self._make_kv_manager()
        if isinstance(self.kv, HybridKVCacheManager):  # a sliding group holds ~W tokens, not the whole context
            self.max_model_len = self._hybrid_max_model_len(
                config.max_model_len or self.model_config.max_position_embeddings)
        self.tiers = build_tiers(config, self.kv, runner)
        if not self._calibrate_kv_scales:
            self._tie_disk_tier_to_identity()
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, config.preemption_mode),
            self.kv, self.tiers, clock=clock)
        self.input_processor = InputProcessor(
            self.model_config, max_model_len=self.max_model_len, num_blocks=self.num_blocks,
            block_size=self.block_size, load_tokenizer=lambda: self._load_tokenizer(tokenizer), seed=config.seed,
            blocks_for_tokens=getattr(self.kv, "max_blocks_for", None),
            computes_logits=getattr(runner, "computes_logits", True))
        self.output_processor = OutputProcessor(lambda: self.input_processor.tokenizer)
        # called as logger(engine, outputs) after every step (metrics, progress logs)
        self.stat_loggers: list[Callable[["Engine", list[RequestOutput]], None]] = []
        self._requests: dict[str, Request] = {}  # every request whose final output has not been handed out
        self._arrivals = itertools.count()
        self._in_flight: tuple[SchedulerOutput, StepHandle] | None = None
        if config.prefix_cache_snapshot:
            self._restore_prefix_cache_at_start(config.prefix_cache_snapshot)

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
        if self.config.prefix_cache_snapshot and not owns_pool:
            raise ValueError("prefix_cache_snapshot needs a runner that owns a device KV pool (ModelRunner)")
        if jax.process_count() > 1 and (self.config.host_cache_bytes is not None
                                        or self.config.prefix_cache_snapshot):
            raise ValueError("host_cache_bytes and prefix_cache_snapshot are single-process only: with "
                             f"{jax.process_count()} processes no process can read a whole pool block")

    def _make_kv_manager(self) -> KVManager:
        if self.config.kv_layout == "contiguous" and not kv_cache_layout(self.model_config.layer_windows).is_hybrid:
            from jaxpaged.cache.contiguous import ContiguousKVCacheManager
            return ContiguousKVCacheManager(self.num_blocks, self.block_size, max_model_len=self.max_model_len)
        layout = kv_cache_layout(self.model_config.layer_windows)
        if layout.is_hybrid:
            self._check_hybrid_features()
            return HybridKVCacheManager(self.num_blocks, self.block_size, layout,
                                        enable_prefix_caching=self.config.enable_prefix_caching,
                                        hash_algo=self.config.hash_algo,
                                        max_chunk_tokens=self.config.max_num_batched_tokens,
                                        eviction_policy=self.config.eviction_policy, clock=self.clock)
        kv = KVCacheManager(self.num_blocks, self.block_size,
                            enable_prefix_caching=self.config.enable_prefix_caching,
                            hash_algo=self.config.hash_algo, eviction_policy=self.config.eviction_policy,
                            clock=self.clock)
        if self.config.kv_cache_metrics_sample > 0:
            kv.track_residency(self.config.kv_cache_metrics_sample)
        return kv

    def _hybrid_max_model_len(self, limit: int) -> int:
        """The longest sequence (at most `limit`) whose blocks in every KV cache group fit the pool."""
        low, high = 0, limit  # can_fit(low) holds; find the largest such length by bisection
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self.kv.can_fit(mid) else (low, mid - 1)
        return low

    def _check_hybrid_features(self) -> None:
        """Features the sliding-window (hybrid) KV cache manager does not support yet: ValueError."""
        config = self.config
        for name, on in (("host_cache_bytes", config.host_cache_bytes is not None),
                         ("prefix_cache_snapshot", bool(config.prefix_cache_snapshot)),
                         ("kv_layout='contiguous'", config.kv_layout == "contiguous"),
                         ("kv_cache_metrics_sample", config.kv_cache_metrics_sample > 0)):
            if on:
                raise ValueError(f"{name} is not supported for models with sliding-window layers yet "
                                 f"(layer_types / sliding_window in the model config)")

    def _tie_disk_tier_to_identity(self) -> None:
        """Disk-tier files are tied to this engine's identity (model, weights, layout, final fp8 scales)."""
        if self.tiers is not None and self.tiers.disk is not None:
            from jaxpaged.snapshot import engine_identity, identity_digest
            self.tiers.set_format(identity_digest(engine_identity(self)))

    def _load_tokenizer(self, given):
        if given is not None:
            return given
        from jaxpaged.tokenizer import load_tokenizer
        return load_tokenizer(self.config.model, self.model_config)

    @property
    def tokenizer(self):
        """The tokenizer for string prompts and output text (bytes unless the checkpoint has one)."""
        return self.input_processor.tokenizer

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Tokens that end a sequence unless ignore_eos: the model's EOS plus the tokenizer's stop ids."""
        return self.input_processor.eos_token_ids

    @property
    def stats(self) -> SchedulerStats:
        """Step and token counters, and the last scheduled step's batch."""
        return self.scheduler.stats

    # ---- requests -------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | Seq[int] | dict,
        params: SamplingParams | None = None,
        *,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Validate and queue a request; raises ValueError (changing nothing) on bad input."""
        check_str("request_id", request_id)
        if arrival_time is not None:
            arrival_time = check_float("arrival_time", arrival_time)
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = self.input_processor.process(
            request_id, prompt, params or SamplingParams(), cache_salt=cache_salt,
            arrival_time=self.clock() if arrival_time is None else arrival_time,
            arrival_order=next(self._arrivals))
        self._requests[request_id] = request
        self.scheduler.add_request(request)

    def pin_prefix(self, prompt: str | Seq[int] | dict, ttl_s: float, *, cache_salt: str | None = None) -> int:
        """Keep the full blocks of `prompt` (under `cache_salt`) for `ttl_s` seconds: they are evicted only
        after every unpinned block, whether cached now or once computed. `ttl_s` 0 unpins. Returns how many
        of its blocks are cached now; ValueError on a bad prompt or TTL (nothing changes)."""
        ttl_s = check_float("ttl_s", ttl_s, low=0.0, high=MAX_PIN_TTL_S)
        _, token_ids, cache_salt = self.input_processor._parse_prompt(prompt, cache_salt)
        if not token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        if not isinstance(self.kv, KVCacheManager) or not self.kv.enable_prefix_caching:
            raise ValueError("pinning needs the paged KV layout with enable_prefix_caching")
        return self.kv.pin_prefix(token_ids, ttl_s, cache_salt=cache_salt)

    def validate_prompt(self, prompt: str | Seq[int] | dict, params: SamplingParams | None = None) -> None:
        """Raise ValueError if `add_request` would reject this prompt (changes nothing)."""
        self.input_processor.validate(prompt, params or SamplingParams())

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its blocks; its final output comes from the next `step()`.

        Unknown or finished ids are ignored.
        """
        request = self._requests.get(request_id)
        if request is None or request.finish_time is not None:
            return
        self.scheduler.abort_request(request, self.clock())

    @property
    def has_step_in_flight(self) -> bool:
        """Whether a dispatched step's results are still to be processed (asynchronous scheduling)."""
        return self._in_flight is not None

    def has_request(self, request_id: str) -> bool:
        """Whether `request_id` is in use: added, and its final output not yet returned by `step()`."""
        return request_id in self._requests

    def has_unfinished_requests(self) -> bool:
        """Whether some request has not had its final output yet (an aborted one waits for `step()`)."""
        return bool(self._requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

    # ---- persistent prefix cache (jaxpaged.snapshot) ----------------------------------------

    def save_prefix_cache(self, path: str | None = None) -> int:
        """Snapshot the cached blocks (hashes, tokens, K/V) to `path` (default: `prefix_cache_snapshot`).

        Returns the number of blocks written; an earlier snapshot at `path` is replaced.
        """
        from jaxpaged.snapshot import save_prefix_cache
        path = path or self.config.prefix_cache_snapshot
        if not path:
            raise ValueError("save_prefix_cache needs a path (or EngineConfig.prefix_cache_snapshot)")
        return save_prefix_cache(self, path)

    def load_prefix_cache(self, path: str):
        """Restore a snapshot into the prefix cache; ValueError if it was made for another engine.

        An fp8 engine whose scales are not calibrated yet adopts the snapshot's.

        Returns `jaxpaged.snapshot.RestoreStats` (blocks restored / skipped / dropped for room).
        """
        from jaxpaged.snapshot import load_prefix_cache
        stats = load_prefix_cache(self, path, adopt_kv_scales=self._calibrate_kv_scales)
        if self._calibrate_kv_scales:  # an fp8 engine took the snapshot's scales: no calibration now
            self._calibrate_kv_scales = False
            self._tie_disk_tier_to_identity()
        return stats

    def shutdown(self) -> None:
        """End of service: saves the prefix cache if `save_prefix_cache_on_shutdown`."""
        if self.config.save_prefix_cache_on_shutdown:
            self.save_prefix_cache()

    def _restore_prefix_cache_at_start(self, path: str) -> None:
        from pathlib import Path
        if Path(path).exists():  # absent: a first start, nothing to restore
            self.load_prefix_cache(path)

    # ---- the step -------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, dispatch the device step, process the results that came back, emit outputs.

        Returns an output for every request that advanced (as its
        `output_kind` asks) and for every request that finished. With
        asynchronous scheduling the results processed are the previous step's.
        """
        overlap = self._can_overlap()
        advanced: list[Request] = []
        if self._in_flight is not None and not overlap:
            advanced += self._finish_in_flight()  # beam search needs the previous step's tokens first
        with jax.profiler.TraceAnnotation("schedule"):
            scheduler_output = self.scheduler.schedule()
        handle = self._dispatch(scheduler_output)
        if self._in_flight is not None:
            advanced += self._finish_in_flight()  # the previous step's results, while this step runs
        self._in_flight = (scheduler_output, handle)
        if not overlap:
            advanced += self._finish_in_flight()
        outputs = self.collect_outputs(advanced)
        for logger in self.stat_loggers:
            logger(self, outputs)
        return outputs

    def _can_overlap(self) -> bool:
        return self.config.async_scheduling and not self.scheduler.num_beam_requests

    def _dispatch(self, scheduler_output: SchedulerOutput) -> StepHandle:
        """Lower-tier transfers, fp8 calibration on the first prefill, then the runner's step."""
        if self.tiers is not None:  # before CoW copies: offloads must read blocks before reuse
            self.tiers.apply(self.runner)
        if self._calibrate_kv_scales and scheduler_output.seqs:
            seq, start, n = scheduler_output.seqs[0], scheduler_output.starts[0], scheduler_output.num_tokens[0]
            with jax.profiler.TraceAnnotation("fp8_calibration"):
                self.runner.calibrate_kv_scales(seq.token_ids[:start + n], self.config.kv_scale_margin)
            self._calibrate_kv_scales = False
            self._tie_disk_tier_to_identity()
        return self.runner.execute_model(scheduler_output)

    def _finish_in_flight(self) -> list[Request]:
        """Wait for the step in flight and apply its results; returns the requests it advanced."""
        scheduler_output, handle = self._in_flight
        self._in_flight = None
        result = handle.result()
        now = self.clock()
        if self.tiers is not None:
            self.tiers.finish()
        if not scheduler_output.seqs:
            return []
        with jax.profiler.TraceAnnotation("update_from_output"):
            return self.scheduler.update_from_output(scheduler_output, result, now)

    def collect_outputs(self, advanced: list[Request]) -> list[RequestOutput]:
        """Outputs for the requests that advanced, and for every request finished since the last call.

        `step()` calls it; so does the simulator's decode fast-forward, which
        runs the scheduler's parts itself.
        """
        for seq, stop in self.output_processor.find_stop_strings(advanced):
            seq.stop_reason = stop
            self.scheduler.finish_seq(seq, "stop", self.clock())
        finished = self.scheduler.take_finished_requests()
        for request in finished:
            del self._requests[request.request_id]
        with jax.profiler.TraceAnnotation("process_outputs"):
            return self.output_processor.process(advanced, finished)
