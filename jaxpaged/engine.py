"""The serving loop: scheduler + KV cache manager on the host, one jitted step on the device.

`Engine` is the low-level API benchmarks drive (`add_request`, `step`, `abort`,
`has_unfinished_requests`); `jaxpaged.llm.LLM` wraps it for offline batches.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import struct
import time
from typing import Callable, Sequence as Seq

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.attention import resolve_backend
from jaxpaged.buckets import pow2_bucket
from jaxpaged.cache import KVCacheManager
from jaxpaged.kv.fp8 import DEFAULT_SCALE_MARGIN, calibrate_kv_scales, validate_kv_scales
from jaxpaged.kv.pool import kv_dtype_from_name
from jaxpaged.offload.setup import build_tiers, validate_tier_options
from jaxpaged.model import LlamaModel
from jaxpaged.outputs import CompletionOutput, RequestMetrics, RequestOutput
from jaxpaged.runner import ModelRunner
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.scheduler import Scheduler, SchedulerConfig
from jaxpaged.sequence import Request, Sequence, SeqStatus
from jaxpaged.step_input import ScheduledSeq

DEFAULT_KV_CACHE_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes an engine; `LLM(**kwargs)` fills it."""

    model: str = "tiny"
    block_size: int = 16
    num_blocks: int | None = None  # or derive it from kv_cache_bytes
    kv_cache_bytes: int | None = None
    enable_prefix_caching: bool = True
    prefix_cache_snapshot: str | None = None  # directory: restored at start if it exists
    save_prefix_cache_on_shutdown: bool = False  # shutdown() writes the snapshot there
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # default: the model's, capped by the pool
    attention_backend: str = "auto"
    pallas_interpret: bool = False
    kv_cache_dtype: str = "auto"
    dtype: str | None = None
    seed: int = 0
    hash_algo: str = "sha256"
    pool_fill_value: float = 0.0  # NaN in tests proves stale slots never leak
    kv_layout: str = "paged"  # or "contiguous": the naive baseline, max_model_len reserved per sequence
    # fp8 KV: (k_scale, v_scale), each [num_layers, num_kv_heads]; None = calibrate on the first prefill
    kv_scales: tuple | None = None
    kv_scale_margin: float = DEFAULT_SCALE_MARGIN
    # lower tiers: host RAM cache of evicted cached blocks (off unless set), optional disk cache behind it
    host_cache_bytes: int | None = None
    disk_cache_dir: str | None = None
    disk_cache_bytes: int = 1 << 30
    preemption_mode: str = "recompute"  # or "swap": preempted blocks go to the host tier and back

    def __post_init__(self):
        if self.save_prefix_cache_on_shutdown and not self.prefix_cache_snapshot:
            raise ValueError("save_prefix_cache_on_shutdown needs prefix_cache_snapshot (the directory)")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {self.num_blocks}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be positive, got {self.kv_cache_bytes}")
        if self.kv_layout not in ("paged", "contiguous"):
            raise ValueError(f"kv_layout must be 'paged' or 'contiguous', got {self.kv_layout!r}")
        if not self.kv_scale_margin >= 1.0:
            raise ValueError(f"kv_scale_margin must be >= 1.0, got {self.kv_scale_margin}")
        validate_tier_options(self)


@dataclasses.dataclass
class EngineStats:
    """Cumulative counters plus the last step's batch (read by metrics and benchmarks)."""

    num_steps: int = 0
    prompt_tokens: int = 0  # prompt tokens computed (cache hits excluded)
    generation_tokens: int = 0
    last_step_tokens: int = 0
    last_step_seqs: int = 0
    # the last step's batch: (request id, sequence index, tokens computed), in schedule order
    last_step_batch: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)


class Engine:
    """Continuous-batching engine over one model and one paged KV pool."""

    def __init__(
        self,
        config: EngineConfig,
        model: LlamaModel | None = None,
        *,
        tokenizer=None,
        runner=None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """Build the engine; `runner` replaces the device (e.g. a simulator), `clock` the time source."""
        self.config = config
        self.clock = clock
        if runner is None and model is None:
            from jaxpaged.checkpoint import load_model
            model = load_model(config.model, dtype=config.dtype, seed=config.seed)
        self.model_config = runner.config if runner is not None else model.config
        self._tokenizer = tokenizer
        kv_dtype = kv_dtype_from_name(config.kv_cache_dtype, config.dtype or self.model_config.dtype)
        self.num_blocks = config.num_blocks or self._blocks_for_bytes(kv_dtype)
        self.block_size = config.block_size
        self.max_model_len = min(config.max_model_len or self.model_config.max_position_embeddings,
                                 self.num_blocks * self.block_size)
        kv_scales = None
        if config.kv_scales is not None:
            kv_scales = validate_kv_scales(self.model_config, config.kv_scales)
        # fp8 without given scales: calibrate on the first prefill, before anything is written
        self._calibration_model = (model if runner is None and kv_scales is None
                                   and kv_dtype == np.dtype("float8_e4m3fn") else None)
        if runner is None:
            backend = resolve_backend(config.attention_backend, interpret=config.pallas_interpret)
            runner = ModelRunner(model, self.num_blocks, self.block_size, kv_dtype=kv_dtype,
                                 backend=backend, pool_fill_value=config.pool_fill_value,
                                 kv_scales=kv_scales)
        self.runner = runner
        self.kv = self._make_kv_manager()
        self.tiers = build_tiers(config, self.kv, self.runner)
        if self.tiers is not None and self.tiers.disk is not None and self._calibration_model is None:
            self.tiers.set_format(self.runner.pool)
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens),
                                   self.kv, self.tiers, config.preemption_mode)
        self.stats = EngineStats()
        # called as logger(engine, finished_outputs) after every step (metrics, progress logs)
        self.stat_loggers: list[Callable[["Engine", list[RequestOutput]], None]] = []
        self._requests: dict[str, Request] = {}
        self._finished: list[Request] = []
        self._arrivals = itertools.count()
        self._seed_rng = np.random.default_rng(config.seed)
        if config.prefix_cache_snapshot:
            self._restore_prefix_cache_at_start(config.prefix_cache_snapshot)

    def _make_kv_manager(self):
        if self.config.kv_layout == "contiguous":
            from jaxpaged.cache.contiguous import ContiguousKVCacheManager
            return ContiguousKVCacheManager(self.num_blocks, self.block_size,
                                            max_model_len=self.max_model_len)
        return KVCacheManager(self.num_blocks, self.block_size,
                              enable_prefix_caching=self.config.enable_prefix_caching,
                              hash_algo=self.config.hash_algo)

    def _blocks_for_bytes(self, kv_dtype) -> int:
        budget = self.config.kv_cache_bytes or DEFAULT_KV_CACHE_BYTES
        per_block = self.config.block_size * self.model_config.kv_bytes_per_token(np.dtype(kv_dtype).name)
        if budget < per_block:
            raise ValueError(f"kv_cache_bytes={budget} is smaller than one block ({per_block} bytes)")
        return budget // per_block

    @property
    def tokenizer(self):
        """The tokenizer for string prompts and output text (bytes unless the checkpoint has one)."""
        if self._tokenizer is None:
            from jaxpaged.tokenizer import load_tokenizer
            self._tokenizer = load_tokenizer(self.config.model, self.model_config)
        return self._tokenizer

    @functools.cached_property
    def eos_token_ids(self) -> frozenset[int]:
        """Tokens that end a sequence unless ignore_eos: the model's EOS plus the tokenizer's stop ids."""
        ids = set(getattr(self.tokenizer, "stop_token_ids", ()))
        if self.model_config.eos_token_id is not None:
            ids.add(self.model_config.eos_token_id)
        return frozenset(ids)

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
        params = params or SamplingParams()
        text, token_ids, cache_salt = self._parse_prompt(prompt, cache_salt)
        self._validate(request_id, token_ids, params)
        request = Request(request_id, token_ids, params,
                          arrival_time=self.clock() if arrival_time is None else arrival_time,
                          arrival_order=next(self._arrivals), prompt=text, cache_salt=cache_salt)
        base_seed = int(self._seed_rng.integers(2**31)) if params.seed is None else params.seed
        request.base_seed = base_seed
        # n > 1: one sequence prefills all but the last prompt token, then forks n ways
        width = params.n if not params.use_beam_search else 1
        request.fork_pending = width > 1 and len(token_ids) > 1
        copies = 1 if request.fork_pending else width
        request.seqs = [Sequence(request, list(token_ids), i) for i in range(copies)]
        self._requests[request_id] = request
        for seq in request.seqs:
            self.scheduler.add(seq)

    def validate_prompt(self, prompt: str | Seq[int] | dict, params: SamplingParams | None = None) -> None:
        """Raise ValueError if `add_request` would reject this prompt (changes nothing)."""
        _, token_ids, _ = self._parse_prompt(prompt, None)
        self._validate(None, token_ids, params or SamplingParams())

    def _parse_prompt(self, prompt, cache_salt):
        text = None
        if isinstance(prompt, dict):
            cache_salt = prompt.get("cache_salt", cache_salt)
            if "prompt_token_ids" in prompt:
                prompt = prompt["prompt_token_ids"]
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a dict prompt needs 'prompt_token_ids' or 'prompt'")
        if isinstance(prompt, str):
            text, prompt = prompt, self.tokenizer.encode(prompt)
        return text, self._token_ids(prompt), cache_salt

    def _token_ids(self, values) -> list[int]:
        """The prompt as Python ints; ValueError unless every id is an integer in the vocabulary."""
        if isinstance(values, np.ndarray):
            ids = values
            if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
                raise ValueError(f"prompt token ids must be a flat sequence of integers, "
                                 f"got dtype {ids.dtype} and shape {ids.shape}")
        else:  # any iterable of ids: one C pass that rejects non-integers (2.5, "7", [1])
            if isinstance(values, (bytes, bytearray)):
                raise ValueError("prompt token ids must be integers, not bytes (pass a str to tokenize it)")
            if not isinstance(values, (list, tuple)):
                values = tuple(values)  # a range, a generator: struct.pack needs their length
            try:
                ids = np.frombuffer(struct.pack(f"<{len(values)}q", *values), dtype=np.int64)
            except struct.error as err:
                raise ValueError(f"prompt token ids must be a flat sequence of integers: {err}") from None
        if ids.size == 0:
            return []
        vocab = self.model_config.vocab_size
        if ids.min() < 0 or ids.max() >= vocab:
            bad = ids[(ids < 0) | (ids >= vocab)][0]
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        return ids.tolist()

    def _validate(self, request_id: str, token_ids: list[int], params: SamplingParams) -> None:
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        total = len(token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt ({len(token_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                             f"exceeds max_model_len ({self.max_model_len})")
        width = max(params.n, params.beam_width)
        bs = self.block_size
        # the prompt's blocks, shared, plus each sequence's own tail: the most the request can hold
        needed = -(-len(token_ids) // bs) + width * (-(-params.max_tokens // bs) + 1)
        if needed > self.num_blocks:
            raise ValueError(f"request can never fit the KV pool: it may need {needed} blocks of {bs} tokens, "
                             f"the pool has {self.num_blocks}")

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its blocks; unknown or finished ids are ignored."""
        request = self._requests.get(request_id)
        if request is None or request.finish_time is not None:
            return
        request.aborted = True
        for seq in list(request.seqs):
            self._finish_seq(seq, "abort", self.clock())

    def has_unfinished_requests(self) -> bool:
        return any(r.finish_time is None for r in self._requests.values())

    def get_num_unfinished_requests(self) -> int:
        return sum(r.finish_time is None for r in self._requests.values())

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

        Returns `jaxpaged.snapshot.RestoreStats` (blocks restored / skipped / dropped for room).
        """
        from jaxpaged.snapshot import load_prefix_cache
        return load_prefix_cache(self, path)

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
        """Schedule, run one device step, and return the requests that finished in it."""
        with jax.profiler.TraceAnnotation("schedule"):
            out = self.scheduler.schedule()
        if self.tiers is not None:  # before CoW copies: offloads must read blocks before reuse
            self.runner.pool = self.tiers.apply(self.runner.pool)
        if out.copies:
            self.runner.copy_blocks(out.copies)
        self.stats.last_step_batch = [(s.request.request_id, s.index, n) for s, n in out.scheduled]
        if out.scheduled:
            self._run(out.scheduled)
        if self.tiers is not None:
            self.tiers.finish()
        outputs = self._take_finished_outputs()
        for logger in self.stat_loggers:
            logger(self, outputs)
        return outputs

    def _take_finished_outputs(self) -> list[RequestOutput]:
        """Outputs of the requests finished since the last call; forgets those requests."""
        finished, self._finished = self._finished, []
        outputs = []
        for request in finished:
            del self._requests[request.request_id]
            outputs.append(self._output(request))
            # A sequence points at its request and the request at its sequences: break that cycle, so
            # reference counting frees them now instead of the cyclic GC (whole token lists) later.
            request.finished_seqs = []
        return outputs

    def _run(self, scheduled: list[tuple[Sequence, int]]) -> None:
        now = self.clock()
        beam = max((s.request.params.beam_width for s, _ in scheduled
                    if s.request.params.use_beam_search), default=0)
        if self._calibration_model is not None:
            self._calibrate_fp8(scheduled)
        with jax.profiler.TraceAnnotation("prepare_inputs"):
            batch = [self._schedule_entry(seq, n) for seq, n in scheduled]
        result = self.runner.run_batch(batch, num_top_logprobs=pow2_bucket(2 * beam) if beam else 0)
        done = self.clock()
        with jax.profiler.TraceAnnotation("process_samples"):
            self._process(scheduled, result, now, done)

    def _calibrate_fp8(self, scheduled: list[tuple[Sequence, int]]) -> None:
        """Set the fp8 pool's scales from the first scheduled chunk (the first step writes nothing before)."""
        seq, n = scheduled[0]
        tokens = seq.token_ids[:seq.num_computed_tokens + n]
        with jax.profiler.TraceAnnotation("fp8_calibration"):
            k_scale, v_scale = calibrate_kv_scales(self._calibration_model, tokens, self.block_size,
                                                   self.config.kv_scale_margin)
        self.runner.pool = self.runner.pool._replace(k_scale=jnp.asarray(k_scale),
                                                     v_scale=jnp.asarray(v_scale))
        self._calibration_model = None
        if self.tiers is not None:
            self.tiers.set_format(self.runner.pool)

    def _process(self, scheduled, result, now: float, done: float) -> None:
        self.stats.num_steps += 1
        self.stats.last_step_tokens = sum(n for _, n in scheduled)
        self.stats.last_step_seqs = len(scheduled)
        touched = {}  # requests in schedule order (a dict: each once)
        token_ids, logprobs = result.token_ids.tolist(), result.logprobs.tolist()
        for i, (seq, n) in enumerate(scheduled):
            request = seq.request
            touched[request] = None
            if not self._computed(seq, n, now):
                continue
            if request.params.use_beam_search:
                seq.pending_candidates = list(zip(result.top_ids[i].tolist(), result.top_logprobs[i].tolist()))
            else:
                self._append(seq, token_ids[i], logprobs[i], done)
        for request in touched:
            if request.params.use_beam_search and request.seqs and all(
                    s.pending_candidates is not None for s in request.seqs):
                self._beam_step(request, done)
            self._record_block_usage(request)

    def _computed(self, seq: Sequence, n: int, now: float) -> bool:
        """Record that `seq` computed `n` more tokens in the step that started at `now`.

        Commits them to the cache manager and forks a finished n > 1 prompt.
        True when the step's output is a token this sequence must take (its
        last token was computed), False for a prefill chunk that is not the last.
        """
        request = seq.request
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now
        computed = seq.num_computed_tokens
        num_prompt = len(request.prompt_token_ids)
        if computed < num_prompt:
            self.stats.prompt_tokens += min(computed + n, num_prompt) - computed
        seq.num_computed_tokens = computed = computed + n
        self.kv.commit(seq.seq_id, seq.token_ids, computed)
        if request.fork_pending:
            if computed == seq.compute_limit:
                self._fork_samples(request)
            return False
        return computed == seq.num_tokens

    def _schedule_entry(self, seq: Sequence, n: int) -> ScheduledSeq:
        p = seq.request.params
        start = seq.num_computed_tokens
        return ScheduledSeq(
            token_ids=seq.token_ids[start:start + n],
            num_computed_tokens=start,
            block_table=self.kv.block_table(seq.seq_id),
            temperature=0.0 if p.use_beam_search else p.temperature,
            top_k=p.top_k,
            top_p=p.top_p,
            seed=(seq.request.base_seed * 1_000_003 + seq.index) & 0xFFFFFFFF,
            sample_index=seq.num_output_tokens,
        )

    def _fork_samples(self, request: Request) -> None:
        """The prompt (all but its last token) is in the pool: fork it into n sequences."""
        request.fork_pending = False
        parent = request.seqs[0]
        for index in range(1, request.params.n):
            self._fork(parent, index)

    def _fork(self, parent: Sequence, index: int) -> Sequence:
        child = parent.fork(index)
        self.kv.fork(parent.seq_id, child.seq_id)
        parent.request.seqs.append(child)
        self.scheduler.add_running(child)
        return child

    def _append(self, seq: Sequence, token: int, logprob: float, now: float) -> None:
        seq.token_ids.append(token)
        seq.cumulative_logprob += logprob
        self.stats.generation_tokens += 1
        if seq.request.first_token_time is None:
            seq.request.first_token_time = now
        if seq.index == 0:
            seq.request.token_times.append(now)
        reason = self._stop_reason(seq, token)
        if reason:
            self._finish_seq(seq, reason, now)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.request.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _beam_step(self, request: Request, now: float) -> None:
        """Keep the beam_width best extensions of the live beams; fork where a beam is kept twice."""
        p = request.params
        live = list(request.seqs)
        candidates = [(seq, tok, seq.cumulative_logprob + lp)
                      for seq in live for tok, lp in seq.pending_candidates]
        eos = self.eos_token_ids
        candidates.sort(key=lambda c: beam_score(c[0].num_output_tokens + 1, c[2],
                                                 c[1] in eos and not p.ignore_eos, p.length_penalty),
                        reverse=True)
        chosen, kept = [], set()
        for seq, tok, cum in candidates[:p.beam_width]:
            if seq in kept:  # fork before the parent appends its own token
                seq = self._fork(seq, index=len(request.seqs) + len(request.finished_seqs))
            kept.add(seq)
            chosen.append((seq, tok, cum))
        for seq in live:
            seq.pending_candidates = None
            if seq not in kept:  # a pruned beam: drop it without an output
                self.scheduler.finish(seq)
                request.seqs.remove(seq)
        if request.first_token_time is None:
            request.first_token_time = now
        request.token_times.append(now)
        for seq, tok, cum in chosen:
            seq.token_ids.append(tok)
            seq.cumulative_logprob = cum
            self.stats.generation_tokens += 1
            reason = self._stop_reason(seq, tok)
            if reason:
                self._finish_seq(seq, reason, now)

    def _finish_seq(self, seq: Sequence, reason: str, now: float) -> None:
        seq.finish_reason = reason
        self.scheduler.finish(seq)
        request = seq.request
        request.seqs.remove(seq)
        request.finished_seqs.append(seq)
        if not request.seqs:
            request.finish_time = now
            self._finished.append(request)

    def _record_block_usage(self, request: Request) -> None:
        if len(request.seqs) == 1:  # nothing shared within the request: skip the table copies
            seq = request.seqs[0]
            held = self.kv.num_blocks_held(seq.seq_id) if seq.status is SeqStatus.RUNNING else 0
            request.peak_blocks_shared = max(request.peak_blocks_shared, held)
            request.peak_blocks_unshared = max(request.peak_blocks_unshared, held)
            return
        tables = [self.kv.block_table(s.seq_id) for s in request.seqs if s.status is SeqStatus.RUNNING]
        request.peak_blocks_shared = max(request.peak_blocks_shared, len(set().union(*tables)) if tables else 0)
        request.peak_blocks_unshared = max(request.peak_blocks_unshared, sum(map(len, tables)))

    def _output(self, request: Request) -> RequestOutput:
        p = request.params
        seqs = request.finished_seqs
        if p.use_beam_search:
            eos = self.eos_token_ids
            seqs = sorted(seqs, key=lambda s: beam_score(
                len(s.output_token_ids), s.cumulative_logprob,
                bool(s.output_token_ids) and s.output_token_ids[-1] in eos and not p.ignore_eos,
                p.length_penalty), reverse=True)[:p.beam_width]
        else:
            seqs = sorted(seqs, key=lambda s: s.index)
        # the request is finished and forgotten: its lists are handed over, not copied
        completions = []
        for i, s in enumerate(seqs):
            token_ids = s.output_token_ids  # a fresh slice
            completions.append(CompletionOutput(
                index=i if p.use_beam_search else s.index,
                token_ids=token_ids,
                text=self._decode(token_ids) if p.detokenize else "",
                cumulative_logprob=s.cumulative_logprob,
                finish_reason=s.finish_reason))
        metrics = RequestMetrics(request.arrival_time, request.first_scheduled_time,
                                 request.first_token_time, request.finish_time, request.num_preemptions,
                                 request.peak_blocks_shared, request.peak_blocks_unshared,
                                 request.token_times)
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids,
                             completions, finished=not request.aborted,
                             num_cached_tokens=request.num_cached_tokens or 0, metrics=metrics)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)


def beam_score(num_generated: int, cumulative_logprob: float, ends_with_eos: bool,
               length_penalty: float) -> float:
    """Length-normalised beam score: logprob / len ** penalty, len counting generated tokens but not EOS."""
    length = max(num_generated - int(ends_with_eos), 1)
    return cumulative_logprob / (length ** length_penalty)
