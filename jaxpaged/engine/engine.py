"""The engine: a thin loop over explicit parts.

    step():  schedule  ->  dispatch the device step  ->  process outputs  ->  emit outputs
             Scheduler     Runner.execute_model          Scheduler.update_from_output
                                                                            OutputProcessor

With `async_scheduling` (the default) the host schedules and lays out step N+1
and dispatches it before it reads step N's tokens; N's outputs are processed
while N+1 runs on the device, and the tokens N sampled are N+1's inputs
straight from the device. Beam search needs each step's tokens before the next
is scheduled, so the engine runs synchronously while a beam request is live.
The overlapped or synchronous step is chosen once, when the engine is built.

`EngineBuilder` (`jaxpaged.engine.builder`) assembles the parts; this class is
only the loop over them, plus the questions outside code asks
(`jaxpaged.engine.queries`). `Engine` is the low-level API benchmarks and servers drive (`add_request`,
`step`, `abort`, `has_unfinished_requests`); `jaxpaged.llm.LLM` wraps it for
offline batches.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from typing import Callable, Container
from typing import Sequence as Seq

import jax

from jaxpaged.engine.builder import EngineBuilder
from jaxpaged.engine.config import EngineConfig
from jaxpaged.engine.fast_forward import can_run_plain_decodes, run_plain_decodes
from jaxpaged.engine.output_processor import OutputProcessor
from jaxpaged.engine.phases import StepPhases
from jaxpaged.engine.pin_quota import PinLedger, PinQuota
from jaxpaged.engine.queries import EngineQueries
from jaxpaged.model import DecoderModel
from jaxpaged.outputs import RequestOutput
from jaxpaged.runner import Runner, StepHandle
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.scheduler import SchedulerOutput, SchedulerStats
from jaxpaged.sequence import Request
from jaxpaged.snapshot import (RestoreStats, engine_identity, load_prefix_cache, restore_prefix_cache_at_start,
                               save_prefix_cache, tie_disk_tier_to_identity)
from jaxpaged.spec_decode import Proposer
from jaxpaged.validation import check_float, check_str

MAX_PIN_TTL_S = 7 * 24 * 3600.0  # a pin outlives no week: pinned blocks must not become a leak


class _Part:
    """An engine attribute that is one of its `EngineParts` (read and written there: the engine keeps no copy)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, engine: "Engine | None", owner: type | None = None):
        return self if engine is None else getattr(engine._parts, self.name)

    def __set__(self, engine: "Engine", value) -> None:
        setattr(engine._parts, self.name, value)


class Engine(EngineQueries):
    """Continuous-batching engine over one model and one paged KV pool."""

    # what the engine is made of and was sized by, as built (`EngineParts`)
    config, clock, model_config = _Part(), _Part(), _Part()
    num_blocks, block_size, max_model_len = _Part(), _Part(), _Part()
    runner, kv, tiers, scheduler, kv_connector = _Part(), _Part(), _Part(), _Part(), _Part()
    input_processor, output_processor = _Part(), _Part()

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
        """Build the parts with `EngineBuilder` (same arguments, checked there), then restore
        `prefix_cache_snapshot`. `runner` replaces the device (e.g. a simulator), `clock` the time source,
        `proposer` the speculative proposer `speculative_config` names (e.g. an EAGLE-style head)."""
        # the engine's parts, also what its persistence (jaxpaged.snapshot) reads and writes
        self._parts = EngineBuilder(config, model, tokenizer=tokenizer, runner=runner, clock=clock,
                                    proposer=proposer).build()
        self._calibrate_kv_scales = self._parts.calibrate_kv_scales  # until the first prefill (or a snapshot)
        # called as logger(engine, outputs) after every step (metrics, progress logs)
        self.stat_loggers: list[Callable[["Engine", list[RequestOutput]], None]] = []
        self._requests: dict[str, Request] = {}  # every request whose final output has not been handed out
        # the same requests by tenant, so counting one tenant's (tenant_requests) walks only its own
        self._requests_by_tenant: dict[str | None, dict[str, Request]] = {}
        self._arrivals = itertools.count()
        self._in_flight: tuple[SchedulerOutput, StepHandle] | None = None
        self._phases = StepPhases()
        self.pin_ledger = PinLedger(self.clock, self.block_size, max_total_blocks=self.num_blocks)
        # chosen once: overlapped (async scheduling) or synchronous steps
        self._run_step = self._overlapped_step if config.async_scheduling else self._sync_step
        self.scheduler.defer_token_masks = config.async_scheduling
        self._adopted_scales(restore_prefix_cache_at_start(self._parts, adopt_kv_scales=self._calibrate_kv_scales))

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
        priority: int = 0,
        tenant: str | None = None,
    ) -> None:
        """Validate and queue a request; raises ValueError (changing nothing) on bad input. ``priority`` (lower
        first) and ``tenant`` matter under the priority and fair scheduling policies."""
        check_str("request_id", request_id)
        if arrival_time is not None:
            arrival_time = check_float("arrival_time", arrival_time)
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = self.input_processor.process(
            request_id, prompt, params or SamplingParams(), cache_salt=cache_salt,
            arrival_time=self.clock() if arrival_time is None else arrival_time,
            arrival_order=next(self._arrivals), priority=priority, tenant=tenant)
        self._requests[request_id] = request
        self._requests_by_tenant.setdefault(request.tenant, {})[request_id] = request
        if self.kv_connector is not None and self.kv_connector.start_load(request):
            return  # its prompt's blocks are being pulled: step() queues it once they are in
        self.scheduler.add_request(request)

    def pin_prefix(self, prompt: str | Seq[int] | dict, ttl_s: float, *, cache_salt: str | None = None,
                   quota: PinQuota | None = None) -> int:
        """Keep the full blocks of `prompt` (under `cache_salt`) for `ttl_s` seconds: they are evicted only
        after every unpinned block, whether cached now or once computed. `ttl_s` 0 unpins. Returns how many
        of its blocks are cached now; ValueError on a bad prompt or TTL, PinQuotaError past `quota`'s bounds
        or the bound on all pins (the pool's block count; pin_quota.py), and nothing changes."""
        ttl_s = check_float("ttl_s", ttl_s, low=0.0, high=MAX_PIN_TTL_S)
        _, token_ids, cache_salt = self.input_processor._parse_prompt(prompt, cache_salt)
        if not token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        if not self.kv.enable_prefix_caching:
            raise ValueError("pinning needs the paged KV layout with enable_prefix_caching")
        return self.pin_ledger.pin(token_ids, cache_salt, ttl_s, quota,
                                   lambda: self.kv.pin_prefix(token_ids, ttl_s, cache_salt=cache_salt))

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
        if self.kv_connector is not None and self.kv_connector.is_loading(request_id):
            self.kv_connector.cancel(request_id)
            self.scheduler.add_request(request)  # queued only to be finished as aborted, as any waiting one
        self.scheduler.abort_request(request, self.clock())

    def set_output_processor(self, processor: OutputProcessor) -> None:
        """Build request outputs with `processor` from now on (the engine core builds them in wire form).

        Only between steps: the outputs of a step in flight are built by the new one.
        """
        self._parts.output_processor = processor

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

    def save_prefix_cache(self, path: str | os.PathLike | None = None) -> int:
        """Snapshot the cached blocks (hashes, tokens, K/V) to `path` (default: `prefix_cache_snapshot`).

        Returns the number of blocks written; an earlier snapshot at `path` is replaced.
        """
        path = path or self.config.prefix_cache_snapshot
        if not path:
            raise ValueError("save_prefix_cache needs a path (or EngineConfig.prefix_cache_snapshot)")
        return save_prefix_cache(self._parts, path)

    def load_prefix_cache(self, path: str | os.PathLike):
        """Restore a snapshot into the prefix cache; ValueError if it was made for another engine.

        An fp8 engine whose scales are not calibrated yet adopts the snapshot's.

        Returns `jaxpaged.snapshot.RestoreStats` (blocks restored / skipped / dropped for room).
        """
        return self._adopted_scales(load_prefix_cache(self._parts, path, adopt_kv_scales=self._calibrate_kv_scales))

    def _adopted_scales(self, stats: RestoreStats | None) -> RestoreStats | None:
        """After a restore (`stats` not None), an fp8 engine whose scales were not calibrated has taken the
        snapshot's: no calibration now, and its identity is final. Returns `stats`."""
        if stats is not None and self._calibrate_kv_scales:
            self._calibrate_kv_scales = False
            tie_disk_tier_to_identity(self._parts)
        return stats

    def snapshot_identity(self) -> dict:
        """What a prefix-cache snapshot of this engine must match to be restored elsewhere (model config,
        weights fingerprint, block size, KV dtype and scales, hash function, KV cache groups)."""
        return engine_identity(self._parts)

    def shutdown(self) -> None:
        """End of service: saves the prefix cache if `save_prefix_cache_on_shutdown`."""
        if self.config.save_prefix_cache_on_shutdown:
            self.save_prefix_cache()
        if self.kv_connector is not None:
            self.kv_connector.close()

    # ---- the step -------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, dispatch the device step, process the results that came back, emit outputs.

        Returns an output for every request that advanced (as its
        `output_kind` asks) and for every request that finished. With
        asynchronous scheduling the results processed are the previous step's.
        """
        if self.kv_connector is not None:
            self._admit_loaded_requests()
        outputs = self._collect_outputs(self._run_step())
        for logger in self.stat_loggers:
            logger(self, outputs)
        return outputs

    def _admit_loaded_requests(self) -> None:
        """Queue the requests whose KV pull ended; with nothing else to run, wait briefly for one."""
        connector = self.kv_connector
        if (connector.num_loading and self._in_flight is None and not self.scheduler.running
                and not self.scheduler.waiting):
            connector.wait(0.005)  # idle: no busy loop while the only requests wait for their blocks
        for request_id in connector.take_loaded():
            request = self._requests.get(request_id)
            if request is not None and request.finish_time is None:
                self.scheduler.add_request(request)

    def _sync_step(self) -> list[Request]:
        """Schedule, dispatch and wait: the requests this step advanced."""
        with self._phases.schedule:
            scheduler_output = self.scheduler.schedule()
        handle = self._dispatch(scheduler_output)
        self._sample_with_masks(scheduler_output, handle)
        self._in_flight = (scheduler_output, handle)
        return self._finish_in_flight()

    def _overlapped_step(self) -> list[Request]:
        """Dispatch this step before reading the previous one's tokens: the requests that step advanced.

        Beam search needs each step's tokens before the next is scheduled, so
        while a beam request is live the step in flight is finished first. A
        grammar's token mask needs the previous step's token too: with such a
        row the runner dispatches only the forward pass, the previous step's
        results are applied, the masks filled, and then the sampling half is
        dispatched, all while the forward pass runs (vLLM's async scheduling
        with structured output). A step in flight that verifies draft tokens
        is finished before the next is scheduled (speculative decoding: the
        drafts it accepted set its sequences' next positions and drafts), and
        so is a plain decode in flight whose sequence would draft now: drafts
        come from known tokens (`Scheduler.drafts_wait_for_step_in_flight`).
        The other steps overlap.
        """
        if self.scheduler.num_beam_requests:
            return self._finish_in_flight() + self._sync_step()
        # after a verify step, its sequences' positions and next drafts depend on how many drafts it accepted;
        # a sequence drafts after its last token known, so it waits for a token in flight it would draft after
        finish_first = self._verify_in_flight() or self.scheduler.drafts_wait_for_step_in_flight()
        advanced = self._finish_in_flight() if finish_first else []
        with self._phases.schedule:
            scheduler_output = self.scheduler.schedule()
        handle = self._dispatch(scheduler_output)
        advanced += self._finish_in_flight()  # the previous step's results, while this step runs
        self._sample_with_masks(scheduler_output, handle)
        self._in_flight = (scheduler_output, handle)
        return advanced

    def _verify_in_flight(self) -> bool:
        """Whether the step in flight verifies draft tokens (speculative decoding)."""
        return self._in_flight is not None and bool(self._in_flight[0].verify_spans)

    def _sample_with_masks(self, scheduler_output: SchedulerOutput, handle: StepHandle) -> None:
        """Fill a deferred step's token masks and dispatch its sampling half (nothing for other steps)."""
        if scheduler_output.token_masks_deferred and scheduler_output.seqs:
            with self._phases.schedule:  # scheduler work, as when masks are filled at schedule time
                self.scheduler.fill_token_masks(scheduler_output)
            handle.sample(scheduler_output.token_mask_indices, scheduler_output.token_masks)

    def _dispatch(self, scheduler_output: SchedulerOutput) -> StepHandle:
        """Lower-tier transfers, fp8 calibration on the first prefill, then the runner's step."""
        if self.tiers is not None:  # before CoW copies: offloads must read blocks before reuse
            self.tiers.apply(self.runner)
        if self._calibrate_kv_scales and scheduler_output.seqs:
            seq, start, n = scheduler_output.seqs[0], scheduler_output.starts[0], scheduler_output.num_tokens[0]
            with jax.profiler.TraceAnnotation("fp8_calibration"):
                self.runner.calibrate_kv_scales(seq.token_ids[:start + n], self.config.kv_scale_margin)
            self._calibrate_kv_scales = False
            tie_disk_tier_to_identity(self._parts)
        return self.runner.execute_model(scheduler_output)

    def _finish_in_flight(self) -> list[Request]:
        """Wait for the step in flight (if any) and apply its results; returns the requests it advanced."""
        if self._in_flight is None:
            return []
        scheduler_output, handle = self._in_flight
        self._in_flight = None
        result = handle.result()
        now = self.clock()
        if self.tiers is not None:
            self.tiers.finish()
        if not scheduler_output.seqs:
            return []
        with self._phases.update:
            return self.scheduler.update_from_output(scheduler_output, result, now)

    def fast_forward(self, *, feed: Callable[[], float] | None = None, until: float = math.inf,
                     stop_after: Container[str] = ()) -> tuple[int, list[RequestOutput]]:
        """Run plain decode steps in bulk, ending exactly where as many `step()` calls would.

        Only with a runner whose steps are predictable (the simulator's) and a
        synchronous engine whose running sequences are all plain decodes;
        otherwise it runs nothing and returns (0, []): call `step()`.
        `feed()`, if given, submits the requests due before each step and
        returns the next arrival time; without it no step starts at or after
        `until`. It stops after a step in which a request in `stop_after`
        finished. Returns (steps run, the outputs those steps' `step()` calls
        would have returned). See `jaxpaged.engine.fast_forward`.
        """
        # tiers moving real blocks and stat loggers expect a call per step; with a step in flight the
        # step-by-step order differs. Blocks that carry no data (the simulator's) may move at the next step.
        real_moves = self.tiers is not None and self.runner.capabilities.owns_kv_pool
        if real_moves or self.stat_loggers or self.has_step_in_flight:
            return 0, []
        if not can_run_plain_decodes(self.scheduler, self.kv, self.runner):
            return 0, []
        steps, advanced = run_plain_decodes(self.scheduler, self.kv, self.runner, feed=feed, until=until,
                                            stop_after=stop_after)
        return steps, self._collect_outputs(advanced)

    def _collect_outputs(self, advanced: list[Request]) -> list[RequestOutput]:
        """Outputs for the requests that advanced, and for every request finished since the last call.

        `step()` calls it, and `fast_forward()` for the steps it ran in bulk.
        """
        for seq, stop, _ in self.output_processor.find_stop_strings(advanced):  # one token a step: none past it
            seq.stop_reason = stop
            self.scheduler.finish_seq(seq, "stop", self.clock())
        finished = self.scheduler.take_finished_requests()
        if self.kv_connector is not None:  # prefill side: keep their prompt blocks for pullers
            self.kv_connector.request_finished(finished)
        for request in finished:
            del self._requests[request.request_id]
            of_tenant = self._requests_by_tenant[request.tenant]
            del of_tenant[request.request_id]
            if not of_tenant:
                del self._requests_by_tenant[request.tenant]
        with self._phases.outputs:
            return self.output_processor.process(advanced, finished)
