"""Continuous-batching scheduler that speaks in token budgets, and the post-step update.

`schedule()` picks each step's batch: running sequences first (decodes and
unfinished prefill chunks, in arrival order), then waiting ones admitted FCFS
while the token budget, the sequence cap and free blocks allow. When a running
sequence cannot get a block, the latest-arrived running request is preempted
(the scheduling policy, policy.py, can change both orders: by priority, or
fair shares between tenants) by recompute: its blocks are freed (cached full blocks stay in the prefix
cache) and it rejoins the front of the queue, where resuming re-hits those
blocks. In swap mode (``preemption_mode="swap"``, needs the host tier) its
computed blocks are first copied to the host and copied back on resume.

With lower tiers (``tiers``), admission continues a prefix match into the host
(and disk) tier: those blocks are copied into freshly allocated device blocks
and committed as computed before the step runs.

`update_from_output()` applies a step's results: it commits the computed
blocks to the cache manager, appends sampled tokens, checks stop conditions,
forks n > 1 prompts, runs beam steps and finishes sequences. With asynchronous
scheduling it runs one step late (after the next step was scheduled), so a
sequence can have one step in flight past its stop; that step's token is
dropped here and its blocks are already free.

With a `proposer` (speculative decoding), each
running decode first gets draft tokens; it is scheduled with its last token
and the k drafts (slots allocated up front, through `allocate_slots`), and
the step returns, per position, the draft when the target accepts it (greedy:
it is the argmax; sampled: rejection sampling, `jaxpaged.runner.rejection`)
or else the target's own token. `update_from_output` accepts the drafts up to
the first one not accepted, appends them plus the target's token after them, commits (hashes) only those accepted tokens'
blocks, rewinds the computed count, and releases the slots of the rejected
ones (`release_slots_after`). A proposer that writes K/V at the draft
positions (`drafts_need_slots`: the draft model) is asked once the batch is
final, with the slots allocated for placeholder drafts (`_fill_drafts`).
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from typing import Callable

import numpy as np

from jaxpaged.cache import NO_CHANGE, BlockTableUpdate, KVManager
from jaxpaged.mathutils import pow2_bucket
from jaxpaged.sampling_params import sequence_seed
from jaxpaged.scheduler.beam import beam_score, rank_candidates
from jaxpaged.scheduler.output import (TOKEN_ON_DEVICE, ModelOutput, NewRow, RowControls, SchedulerOutput,
                                       SchedulerStats)
from jaxpaged.scheduler.policy import arrival_rank, priority_rank, waiting_queue
from jaxpaged.sequence import Request, Sequence, SeqStatus
from jaxpaged.spec_decode.proposer import DraftContext, Proposer
from jaxpaged.structured.bitmask import fill_bitmasks

PREEMPTION_MODES = ("recompute", "swap")
DRAFT_PLACEHOLDER = 0  # a draft slot scheduled before its token is proposed (`Scheduler._fill_drafts`)
# speculative decoding: a sequence whose verify steps accept nothing n times in a row decodes plainly for
# min(2^(n-1), this) steps before it drafts again (a rejected verify step costs more than a decode step)
MAX_SPEC_BACKOFF_STEPS = 8


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """Limits on one step's batch, and what preemption does (checked once, by `EngineConfig`)."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    preemption_mode: str = "recompute"
    scheduling_policy: str = "fcfs"  # one of SCHEDULING_POLICIES (policy.py)


class Scheduler:
    """Decides each step's batch and applies its results; owns the waiting queue and the running list."""

    def __init__(self, config: SchedulerConfig, kv: KVManager, tiers=None, *,
                 clock: Callable[[], float] = time.monotonic, proposer: Proposer | None = None,
                 disable_speculation_at: int | None = None):
        """`tiers` (a `jaxpaged.offload.KVTiers`) adds the host/disk tier; swap mode needs it.

        `proposer` turns on speculative decoding;
        `disable_speculation_at` running sequences turn it off for a step (None: never).
        """
        self.config = config
        self.proposer = proposer
        self.disable_speculation_at = disable_speculation_at
        self.kv = kv
        self.tiers = tiers
        self.clock = clock
        # the waiting queue orders by the policy, and answers what the policy decides (`WaitingQueue`)
        self.waiting = waiting_queue(config.scheduling_policy, self._has_running)
        self._rank = priority_rank if config.scheduling_policy == "priority" else arrival_rank
        self.running: list[Sequence] = []  # in rank order: arrival (request, then sequence index), or priority
        self.num_preemptions = 0
        self.num_beam_requests = 0  # unfinished beam-search requests (they need synchronous steps)
        self.num_top_logprob_requests = 0  # unfinished requests with logprobs > 0 (the step returns top-k)
        self.num_constrained_requests = 0  # unfinished requests with a token mask (structured output)
        # ... of which with a grammar: their mask depends on the last token (see `defer_token_masks`)
        self.num_grammar_requests = 0
        # asynchronous scheduling: a grammar row's mask waits for the previous step's tokens (the engine
        # fills it while the step's forward pass runs); else masks are filled when the step is scheduled
        self.defer_token_masks = False
        self.stats = SchedulerStats()
        self._freed: list[int] = []  # resident sequences that left the running set since the last schedule
        self._finished: list[Request] = []  # finished since the last take_finished_requests()

    # ---- requests ---------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a new request's sequences at the back."""
        for seq in request.seqs:
            seq.status = SeqStatus.WAITING
            self.waiting.append(seq)
        if request.use_beam_search:
            self.num_beam_requests += 1
        if request.params.logprobs:
            self.num_top_logprob_requests += 1
        if request.params.constrained:
            self.num_constrained_requests += 1
            self.num_grammar_requests += request.params.structured_outputs is not None

    def abort_request(self, request: Request, now: float) -> None:
        """Finish every live sequence of `request` now ("abort") and free its blocks."""
        request.aborted = True
        for seq in list(request.seqs):
            self.finish_seq(seq, "abort", now)

    def finish_seq(self, seq: Sequence, reason: str, now: float) -> None:
        """End a sequence with `reason`; the request finishes with its last sequence."""
        seq.finish_reason = reason
        self._release(seq)
        request = seq.request
        request.seqs.remove(seq)
        request.finished_seqs.append(seq)
        if not request.seqs:
            request.finish_time = now
            self._finished.append(request)
            if request.use_beam_search:
                self.num_beam_requests -= 1
            if request.params.logprobs:
                self.num_top_logprob_requests -= 1
            if request.params.constrained:
                self.num_constrained_requests -= 1
                self.num_grammar_requests -= request.params.structured_outputs is not None

    def take_finished_requests(self) -> list[Request]:
        """The requests finished since the last call."""
        finished, self._finished = self._finished, []
        return finished

    # ---- schedule ---------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Pick this step's batch under the token budget; see the module docstring."""
        out = SchedulerOutput()
        now = self.clock()
        budget = self.config.max_num_batched_tokens
        preempted = out.preempted
        allocate_slots = self.kv.allocate_slots
        drafts_of = self._propose_drafts() if self.proposer is not None else None
        for seq in list(self.running):  # kept in arrival order (insort), no per-step sort
            if budget == 0:
                break
            if seq.status is not SeqStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = seq.num_schedulable_tokens
            if num_new == 0:
                continue
            if drafts_of and budget > 1 and seq.seq_id in drafts_of:
                drafts = drafts_of[seq.seq_id][:budget - 1]
                # the drafts' slots come first; without room for them the sequence decodes plainly
                update = allocate_slots(seq.seq_id, 1 + len(drafts), num_computed_tokens=seq.num_computed_tokens)
                if update is not None:
                    self._add(out, seq, 1 + len(drafts), update, now, drafts)
                    budget -= 1 + len(drafts)
                    continue
            if num_new > budget:
                num_new = budget
            update = allocate_slots(seq.seq_id, num_new, num_computed_tokens=seq.num_computed_tokens)
            if update is None:
                update = self._preempt_until_allocated(seq, num_new, preempted)
                if update is None:
                    continue  # seq itself was preempted
            self._add(out, seq, num_new, update, now)
            budget -= num_new
        if preempted:
            self._drop_preempted(out)
        else:
            self._admit_waiting(out, budget, now, may_preempt=True)
            if preempted:  # the priority policy made room for a waiting request that ranks first
                self._drop_preempted(out)
        if out.verify_spans and self.proposer.drafts_need_slots:
            self._fill_drafts(out)
        self._finish_schedule(out)
        if self.num_constrained_requests:
            if self.defer_token_masks and self.num_grammar_requests and out.seqs:
                out.token_masks_deferred = True
            else:
                self.fill_token_masks(out)
        return out

    def fill_token_masks(self, out: SchedulerOutput) -> None:
        """Fill the packed token masks of the step's constrained sequences that sample.

        Every token of those sequences must be known to the host, since a
        grammar's mask follows from the tokens it accepted: at schedule time
        when steps are synchronous, else after the previous step's results
        were applied (`token_masks_deferred`).
        """
        indices = [i for i, (seq, samples) in enumerate(zip(out.seqs, out.samples))
                   if samples and seq.constraint is not None]
        out.token_mask_indices = indices
        if indices:
            constraints = [out.seqs[i].constraint for i in indices]
            out.token_masks = fill_bitmasks(constraints, constraints[0].width)

    def schedule_waiting(self, budget: int) -> SchedulerOutput:
        """Admission alone, with `budget` tokens: the part of `schedule()` after the running sequences.

        For the simulator's decode fast-forward, which runs the running
        sequences itself; statistics are left to the caller.
        """
        out = SchedulerOutput()
        if self.waiting:
            self._admit_waiting(out, budget, self.clock())
        out.freed_seq_ids, self._freed = self._freed, []
        return out

    def _propose_drafts(self) -> dict[int, list[int]]:
        """Draft tokens for the running sequences that speculate, by sequence id (none: not listed).

        A sequence speculates when it is a decode (greedy or sampled) whose
        tokens are all known and none of what speculation does not handle yet
        (beams, logprobs, grammars, logit controls, stop strings). With
        overlapped steps a sequence whose plain decode is in flight decodes
        plainly; the engine finishes that step first when the sequence would
        draft (`drafts_wait_for_step_in_flight`). A sequence whose verify step
        is in flight is not scheduled at all until its results are in. Its
        drafts never take it past `max_len` (max_tokens, max_model_len): all of
        them accepted plus the token after them still fit. No sequence
        speculates while `disable_speculation_at` or more are running.
        """
        if self._speculation_disabled():
            return {}  # a batch this large is compute-bound: drafts would cost more than they save
        seqs = [seq for seq in self.running if _speculates(seq) and not seq.num_placeholders and not _backs_off(seq)]
        if self.proposer.uses_hidden_states:
            seqs = [seq for seq in seqs if seq.last_hidden is not None]
        if not seqs:
            return {}
        limits = [seq.request.max_len - len(seq.token_ids) - 1 for seq in seqs]
        if self.proposer.drafts_need_slots:  # placeholders: `_fill_drafts` asks once the slots exist
            k = self.proposer.num_speculative_tokens
            return {seq.seq_id: [DRAFT_PLACEHOLDER] * min(k, limit) for seq, limit in zip(seqs, limits) if limit > 0}
        proposals = self.proposer.propose([seq.token_ids for seq in seqs], limits)
        return {seq.seq_id: proposal for seq, proposal in zip(seqs, proposals) if proposal}

    def _speculation_disabled(self) -> bool:
        """Whether so many sequences run that none speculates this step (`disable_speculation_at`)."""
        limit = self.disable_speculation_at
        return limit is not None and len(self.running) >= limit

    def drafts_wait_for_step_in_flight(self) -> bool:
        """Whether a sequence would draft this step once the step in flight is finished (overlapped steps).

        A sequence whose plain decode is in flight does not speculate
        (`_propose_drafts`: drafts guessed past an unknown token cost a draft
        and fail whenever the guess does); the engine finishes that step before
        scheduling when this says one would draft. A proposer with
        `drafts_need_slots` (the draft model) always has a proposal; a host-side
        one (n-gram) is asked on the tokens known, and waits only if it
        proposes past the token in flight, so a sequence with nothing to copy
        keeps the overlapped step.
        """
        if self.proposer is None or self._speculation_disabled():
            return False
        seqs = [seq for seq in self.running if seq.num_placeholders and not seq.spec_skip_steps
                and _speculates(seq) and seq.request.max_len - len(seq.token_ids) - seq.num_placeholders > 1]
        if not seqs or self.proposer.drafts_need_slots:
            return bool(seqs)
        limits = [seq.request.max_len - len(seq.token_ids) - 1 for seq in seqs]
        return any(len(p) > 1 for p in self.proposer.propose([seq.token_ids for seq in seqs], limits))

    def _fill_drafts(self, out: SchedulerOutput) -> None:
        """Ask a proposer that needs the verify slots (a draft model) for the drafts of the scheduled spans.

        Each verifying sequence holds slots for its last known token and its
        placeholder drafts; the proposer returns exactly that many tokens, which
        replace the placeholders in the step's tokens.
        """
        seqs = [out.seqs[i] for i, _ in out.verify_spans]
        context = DraftContext(block_tables=[self.kv.block_table(seq.seq_id) for seq in seqs],
                               copies=list(out.copies))
        if self.proposer.uses_hidden_states:
            context.hidden_states = np.stack([seq.last_hidden for seq in seqs])
        counts = [k for _, k in out.verify_spans]
        proposals = self.proposer.propose([seq.token_ids for seq in seqs], counts, context)
        ends = np.cumsum(out.num_tokens).tolist()
        for (i, k), drafts in zip(out.verify_spans, proposals):
            if len(drafts) != k:
                raise RuntimeError(f"the proposer returned {len(drafts)} drafts for {k} allocated slots")
            out.token_ids[ends[i] - k:ends[i]] = drafts
        out.draft_token_ids = [list(drafts) for drafts in proposals]

    def _add(self, out: SchedulerOutput, seq: Sequence, num_new: int, update: BlockTableUpdate,
             now: float, drafts: list[int] | None = None) -> None:
        """Put `num_new` tokens of `seq` in the batch and count them as being computed.

        With `drafts`, the last `len(drafts)` of those tokens are draft tokens to verify.
        """
        start = seq.num_computed_tokens
        end = start + num_new
        tokens = seq.token_ids
        known = len(tokens)
        samples = end == known + seq.num_placeholders or bool(drafts)
        request = seq.request
        if request.prompt_logprobs is not None and start < len(request.prompt_token_ids) - 1:
            count = min(end, len(request.prompt_token_ids) - 1) - start
            out.prompt_logprob_spans.append((len(out.seqs), start, count))
        out.seqs.append(seq)
        out.starts.append(start)
        out.num_tokens.append(num_new)
        out.samples.append(samples)
        if drafts:
            out.verify_spans.append((len(out.seqs) - 1, len(drafts)))
            out.draft_token_ids.append(drafts)
            out.token_ids.extend(_input_tokens(tokens, start, start + 1))  # the last token, maybe on the device
            out.token_ids.extend(drafts)
        elif num_new == 1:
            out.token_ids.append(tokens[start] if start < known else TOKEN_ON_DEVICE)
        else:
            out.token_ids.extend(_input_tokens(tokens, start, end))
        seq.num_computed_tokens = end
        if samples:
            seq.num_placeholders += 1
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now
        if not seq.resident:
            out.new_rows.append(_new_row(seq, self.kv.block_table(seq.seq_id)))
            seq.resident = True
        elif update is NO_CHANGE:
            return  # the common decode step
        elif update.block_ids:
            out.block_updates.append((seq.seq_id, update.start, update.block_ids))
        if update.copies:
            out.copies.extend(update.copies)

    def _preempt_until_allocated(self, seq: Sequence, num_new: int,
                                 preempted: list[Request]) -> BlockTableUpdate | None:
        """Preempt the latest arrivals until `seq` gets its slots; None if `seq` itself was preempted."""
        while True:
            victim = self._victim()
            self.preempt(victim)
            preempted.append(victim)
            if victim is seq.request:
                return None
            update = self.kv.allocate_slots(seq.seq_id, num_new, num_computed_tokens=seq.num_computed_tokens)
            if update is not None:
                return update

    def _victim(self) -> Request:
        """The running request to preempt first, as the scheduling policy says (`WaitingQueue.victim`)."""
        return self.waiting.victim(self.running)

    def _has_running(self, tenant) -> bool:
        return any(s.request.tenant == tenant for s in self.running)

    def _drop_preempted(self, out: SchedulerOutput) -> None:
        """Take sequences preempted late in the loop (after being scheduled) back out of the batch."""
        kept = [i for i, seq in enumerate(out.seqs) if seq.status is SeqStatus.RUNNING]
        dropped = {seq.seq_id for seq in out.seqs if seq.status is not SeqStatus.RUNNING}
        for i, seq in enumerate(out.seqs):
            if seq.seq_id in dropped and out.samples[i]:
                seq.num_placeholders -= 1
        unsent = {row.seq_id for row in out.new_rows if row.seq_id in dropped}
        self._freed = [seq_id for seq_id in self._freed if seq_id not in unsent]  # never had a row
        out.new_rows = [row for row in out.new_rows if row.seq_id not in dropped]
        out.block_updates = [u for u in out.block_updates if u[0] not in dropped]
        new_index = {old: new for new, old in enumerate(kept)}
        out.prompt_logprob_spans = [(new_index[i], start, n) for i, start, n in out.prompt_logprob_spans
                                    if i in new_index]
        drafts_at = {new_index[i]: drafts for (i, _), drafts in zip(out.verify_spans, out.draft_token_ids)
                     if i in new_index}
        out.verify_spans = [(i, len(drafts)) for i, drafts in drafts_at.items()]
        out.draft_token_ids = list(drafts_at.values())
        out.seqs = [out.seqs[i] for i in kept]
        out.starts = [out.starts[i] for i in kept]
        out.num_tokens = [out.num_tokens[i] for i in kept]
        out.samples = [out.samples[i] for i in kept]
        token_ids = []
        for i, (seq, s, n) in enumerate(zip(out.seqs, out.starts, out.num_tokens)):
            drafts = drafts_at.get(i, ())
            token_ids += _input_tokens(seq.token_ids, s, s + n - len(drafts))
            token_ids += drafts
        out.token_ids = token_ids

    def _finish_schedule(self, out: SchedulerOutput) -> None:
        out.freed_seq_ids, self._freed = self._freed, []
        self.waiting.charge(out.seqs, out.starts, out.num_tokens, out.samples)
        if self.num_beam_requests or self.num_top_logprob_requests:
            # beams need 2 * width candidates; `logprobs=k` requests their top k
            top = max((2 * s.request.params.beam_width if s.request.use_beam_search
                       else s.request.params.logprobs or 0 for s in out.seqs), default=0)
            out.num_top_logprobs = pow2_bucket(top) if top else 0
        if out.prompt_logprob_spans:
            seqs = out.seqs
            top = max(seqs[i].request.params.prompt_logprobs for i, _, _ in out.prompt_logprob_spans)
            out.num_prompt_top_logprobs = pow2_bucket(top)
        stats = self.stats
        if out.seqs:
            stats.num_steps += 1
            stats.last_step_tokens = len(out.token_ids)
            stats.last_step_seqs = len(out.seqs)
        stats.set_last_batch(out.seqs, out.num_tokens)

    def preempt(self, request: Request) -> None:
        """Free every running sequence of `request` and put them at the front of the queue."""
        request.num_preemptions += 1
        self.num_preemptions += 1
        for seq in reversed(request.seqs):
            if seq.status is SeqStatus.RUNNING:
                self.running.remove(seq)
                if self.config.preemption_mode == "swap":
                    self.tiers.swap_out(seq.seq_id, seq.num_computed_tokens)
                self._free_blocks(seq)
                seq.num_computed_tokens = 0
                seq.status = SeqStatus.WAITING
                self.waiting.appendleft(seq)

    def _admit_waiting(self, out: SchedulerOutput, budget: int, now: float, may_preempt: bool = False) -> None:
        """Admit waiting sequences in the queue's order while the budget, the sequence cap and free blocks allow.
        With ``may_preempt`` and the priority policy, a sequence short of blocks preempts running requests of
        a strictly higher ``priority`` value (last-ranked first) until it fits."""
        deferred = []
        kv, tiers = self.kv, self.tiers
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            request = seq.request
            if out.preempted and any(r is request for r in out.preempted):
                break  # preempted in this pass: its state settles in _drop_preempted; it resumes next step
            limit = seq.compute_limit
            tokens = seq.token_ids[:limit] if request.fork_pending else seq.token_ids
            if _needs_prompt_logits(request):
                # A cached block has no logits: compute the whole prompt, and count no lookup
                # (as vLLM v1). The blocks it computes are cached for others as usual.
                if not kv.allocate_new(seq.seq_id, tokens, min(limit, budget), None,
                                       cache_salt=request.cache_salt, count_query=False):
                    break
                self.waiting.popleft()
                if tiers is not None:
                    tiers.admitted(seq.seq_id, None)  # a swapped copy has no logits either
                self._admitted(seq, 0, out, min(limit, budget), now)
                budget -= min(limit, budget)
                continue
            match = kv.match_prefix(tokens, cache_salt=request.cache_salt)
            restore = None
            if tiers is not None:
                restore = tiers.plan_restore(seq.seq_id, match, len(tokens), limit)
            num_restored = restore.num_tokens if restore else 0
            if match.num_pending_tokens > 0 and not num_restored and (self.running or out.seqs):
                # Another running sequence is computing this prefix right now: wait a step
                # and hit its blocks instead of computing them twice.
                deferred.append(self.waiting.popleft())
                continue
            num_cached = match.num_cached_tokens + num_restored
            num_new = max(min(limit - num_cached, budget), 0)
            if not kv.allocate_new(seq.seq_id, tokens, num_restored + num_new, match,
                                   cache_salt=request.cache_salt):
                if may_preempt and self._preempt_lower_priority(request, out):
                    continue  # room was made: try again (the match is looked up afresh)
                break  # not enough free blocks: in queue order, so nobody behind it goes first
            self.waiting.popleft()
            if tiers is not None:
                tiers.admitted(seq.seq_id, restore)
            if num_restored:  # the device copy lands before the step: count those tokens as computed
                kv.commit(seq.seq_id, tokens, num_cached)
            self._admitted(seq, num_cached, out, num_new, now)
            budget -= num_new
        self.waiting.extendleft(reversed(deferred))

    def _preempt_lower_priority(self, request: Request, out: SchedulerOutput) -> bool:
        """Priority policy: preempt the last-ranked running request if its priority value is strictly higher
        than ``request``'s; whether one was."""
        if not self.waiting.preempts_lower_priority or not self.running:
            return False
        victim = self.running[-1].request
        if victim.priority <= request.priority:
            return False
        self.preempt(victim)
        out.preempted.append(victim)
        return True

    def _admitted(self, seq: Sequence, num_cached: int, out: SchedulerOutput, num_new: int, now: float) -> None:
        """`seq` got its blocks: it runs, with `num_new` tokens in this step."""
        seq.num_computed_tokens = num_cached
        seq.status = SeqStatus.RUNNING
        bisect.insort(self.running, seq, key=self._rank)
        request = seq.request
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_cached
        if num_new:
            self._add(out, seq, num_new, NO_CHANGE, now)

    # ---- after the step ---------------------------------------------------------------------

    def update_from_output(self, out: SchedulerOutput, result: ModelOutput, now: float) -> list[Request]:
        """Apply a step's results (arrived at `now`); returns the requests it advanced, in schedule order.

        Commits each sequence's computed tokens (a plain decode only when it
        fills a block: nothing is hashed before), appends its sampled token,
        checks stop conditions, forks n > 1 prompts and runs beam steps. A
        sequence that finished after this step was scheduled (stopped, aborted)
        takes nothing from it. One preempted after it was scheduled keeps its
        sampled token but commits nothing: its blocks are gone.
        """
        tokens, logprobs = result.token_ids.tolist(), result.logprobs.tolist()
        kv, stats, bs = self.kv, self.stats, self.kv.block_size
        if out.prompt_logprob_spans and result.prompt_logprobs is not None:
            _record_prompt_logprobs(out, result)
        touched: dict[Request, None] = {}
        beam_ready = []
        verified = self._verified_tokens(out, result) if out.verify_spans else None
        for i, (seq, start, count, samples) in enumerate(zip(out.seqs, out.starts, out.num_tokens, out.samples)):
            status = seq.status
            if status is SeqStatus.FINISHED:
                continue
            request = seq.request
            touched[request] = None
            if verified and i in verified:
                drafts, targets, target_logprobs, hidden = verified[i]
                self._accept_drafts(seq, start, drafts, targets, target_logprobs, now, hidden)
                continue
            end = start + count
            # A decode that leaves its block partial has nothing to hash: its commit waits for the one
            # that fills the block (the manager's growth follows the scheduled tokens). Requests that
            # fork commit every step, since a fork shares exactly the committed blocks.
            if status is SeqStatus.RUNNING and (count > 1 or end % bs == 0 or len(request.seqs) > 1
                                                or request.fork_pending or request.params.beam_width > 1):
                kv.commit(seq.seq_id, seq.token_ids, end)
            num_prompt = len(request.prompt_token_ids)
            if start < num_prompt:
                stats.prompt_tokens += min(end, num_prompt) - start
            if not samples:
                if request.fork_pending and status is SeqStatus.RUNNING and end == num_prompt - 1:
                    self._fork_samples(request)
                continue
            seq.num_placeholders -= 1
            if request.params.beam_width > 1:
                seq.pending_candidates = list(zip(result.top_ids[i].tolist(), result.top_logprobs[i].tolist()))
                if all(s.pending_candidates is not None for s in request.seqs):
                    beam_ready.append(request)
                continue
            if request.params.logprobs is not None:
                self._record_logprobs(seq, result, i, tokens[i], logprobs[i])
            if result.hidden_states is not None:
                seq.last_hidden = result.hidden_states[i]
            self._append(seq, tokens[i], logprobs[i], now)
        for request in beam_ready:
            self._beam_step(request, now)
        touched_list = list(touched)
        for request in touched_list:
            if len(request.seqs) > 1:
                self.record_block_usage(request)
        return touched_list

    @staticmethod
    def _verified_tokens(out: SchedulerOutput, result: ModelOutput):
        """Per verifying sequence (index in `out.seqs`): its drafts, the verified token (and its logprob)
        after each of its k + 1 positions (the draft when accepted, else the target's token), and the
        hidden states at those positions (None unless the step returned them)."""
        ids, logprobs = result.verify_ids.tolist(), result.verify_logprobs.tolist()
        hidden = result.verify_hidden_states
        verified, at = {}, 0
        for (i, k), drafts in zip(out.verify_spans, out.draft_token_ids):
            verified[i] = (drafts, ids[at:at + k + 1], logprobs[at:at + k + 1],
                           None if hidden is None else hidden[at:at + k + 1])
            at += k + 1
        return verified

    def _accept_drafts(self, seq: Sequence, start: int, drafts: list[int], targets: list[int],
                       logprobs: list[float], now: float, hidden: np.ndarray | None = None) -> None:
        """Verification: keep the drafts the target accepted, then its own token after them.

        Greedy, the emitted tokens are exactly what plain greedy decoding would
        give; sampled, they have the target's distribution (rejection sampling).
        They are cut where one ends the sequence. Only the positions whose tokens are
        accepted are committed (hashed, cached); the computed count rewinds to
        them and the rejected drafts' slots are released.
        """
        seq.num_placeholders -= 1
        num_accepted = 0
        while num_accepted < len(drafts) and drafts[num_accepted] == targets[num_accepted]:
            num_accepted += 1
        emitted = targets[:num_accepted + 1]
        request = seq.request
        length = len(seq.token_ids)
        for j, token in enumerate(emitted):  # only the last emitted token may end the sequence
            if token in request.stop_token_ids or length + j + 1 >= request.max_len:
                emitted = emitted[:j + 1]
                break
        self._count_spec_step(len(drafts), num_accepted)
        if hidden is not None:  # the row whose token is emitted last
            seq.last_hidden = hidden[len(emitted) - 1]
        seq.spec_misses = 0 if num_accepted else seq.spec_misses + 1
        if seq.spec_misses:  # back off: 1, 2, 4, ... plain steps before it drafts again
            seq.spec_skip_steps = min(1 << (seq.spec_misses - 1), MAX_SPEC_BACKOFF_STEPS)
        for token, logprob in zip(emitted[:-1], logprobs):
            self._append(seq, token, logprob, now)
        if seq.status is SeqStatus.RUNNING:
            computed = start + len(emitted)  # the last known token and the accepted drafts
            self.kv.commit(seq.seq_id, seq.token_ids, computed)
            self.kv.release_slots_after(seq.seq_id, computed)
            seq.num_computed_tokens = computed
        self._append(seq, emitted[-1], logprobs[len(emitted) - 1], now)

    def _count_spec_step(self, num_drafts: int, num_accepted: int) -> None:
        stats = self.stats
        stats.spec_num_drafts += 1
        stats.spec_num_draft_tokens += num_drafts
        stats.spec_num_accepted_tokens += num_accepted
        per_position = stats.spec_accepted_per_position
        if len(per_position) < num_drafts:
            per_position.extend([0] * (num_drafts - len(per_position)))
        for p in range(num_accepted):
            per_position[p] += 1

    def _append(self, seq: Sequence, token: int, logprob: float, now: float) -> None:
        seq.token_ids.append(token)
        seq.cumulative_logprob += logprob
        seq.token_logprobs.append(logprob)
        self.stats.generation_tokens += 1
        request = seq.request
        if request.first_token_time is None:
            request.first_token_time = now
        if seq.index == 0:
            request.token_times.append(now)
        reason = _stop_reason(seq, token)
        # the grammar refusing the token (its mask allows none such) ends the output here
        rejected = seq.constraint is not None and reason != "stop" and not seq.constraint.accept(token)
        if rejected:
            reason = "stop"
        if reason:
            if reason == "stop" and token not in request.eos_token_ids and not rejected:
                seq.stop_reason = token  # a stop_token_ids id, not EOS (as vLLM reports it)
            self.finish_seq(seq, reason, now)

    @staticmethod
    def _record_logprobs(seq: Sequence, result: ModelOutput, row: int, token: int, logprob: float) -> None:
        """Keep the sampled token's log-probability and the request's top-k for this output token."""
        entry = _logprob_entry(token, logprob, result.top_ids, result.top_logprobs, row, seq.request.params.logprobs)
        if seq.logprobs is None:
            seq.logprobs = []
        seq.logprobs.append(entry)

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
        child.status = SeqStatus.RUNNING
        bisect.insort(self.running, child, key=self._rank)
        return child

    def _beam_step(self, request: Request, now: float) -> None:
        """Keep the beam_width best extensions of the live beams; fork where a beam is kept twice."""
        live = list(request.seqs)
        chosen, kept = [], set()
        for seq, tok, cum in rank_candidates(request, live):
            if seq in kept:  # fork before the parent appends its own token
                seq = self._fork(seq, index=len(request.seqs) + len(request.finished_seqs))
            kept.add(seq)
            chosen.append((seq, tok, cum))
        for seq in live:
            seq.pending_candidates = None
            if seq not in kept:  # a pruned beam: drop it without an output
                self._release(seq)
                request.seqs.remove(seq)
        if request.first_token_time is None:
            request.first_token_time = now
        request.token_times.append(now)
        for seq, tok, cum in chosen:
            seq.token_ids.append(tok)
            seq.token_logprobs.append(cum - seq.cumulative_logprob)
            seq.cumulative_logprob = cum
            self.stats.generation_tokens += 1
            reason = _stop_reason(seq, tok)
            if reason:
                self.finish_seq(seq, reason, now)

    # ---- bookkeeping ------------------------------------------------------------------------

    def _release(self, seq: Sequence) -> None:
        """Take a sequence out of the running set or the queue, freeing what it holds."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self._free_blocks(seq)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
            if self.tiers is not None:
                self.tiers.drop_swap(seq.seq_id)
        seq.status = SeqStatus.FINISHED

    def _free_blocks(self, seq: Sequence) -> None:
        self.record_block_usage(seq.request)  # a lone sequence's table only grows until it is freed
        self.kv.free(seq.seq_id)
        if seq.resident:
            self._freed.append(seq.seq_id)
            seq.resident = False

    def record_block_usage(self, request: Request) -> None:
        """Raise the request's peak block counts to what its running sequences hold now.

        Called before any of its sequences is freed (finish, preemption) and,
        for requests with several sequences (their tables share blocks and
        change), after every step.
        """
        kv = self.kv
        if len(request.seqs) == 1:  # nothing shared within the request: skip the table copies
            seq = request.seqs[0]
            held = kv.num_blocks_held(seq.seq_id) if seq.status is SeqStatus.RUNNING else 0
            request.peak_blocks_shared = max(request.peak_blocks_shared, held)
            request.peak_blocks_unshared = max(request.peak_blocks_unshared, held)
            return
        held = kv.held_blocks  # KV cache groups: slid-out entries are not held
        tables = [held(s.seq_id) for s in request.seqs if s.status is SeqStatus.RUNNING]
        request.peak_blocks_shared = max(request.peak_blocks_shared, len(set().union(*tables)) if tables else 0)
        request.peak_blocks_unshared = max(request.peak_blocks_unshared, sum(map(len, tables)))


def _speculates(seq: Sequence) -> bool:
    """Whether `seq` takes draft tokens this step (see `Scheduler._propose_drafts`)."""
    request = seq.request
    p = request.params
    in_flight = seq.num_placeholders  # at most a plain decode's token: a verify step in flight computed more
    return (seq.status is SeqStatus.RUNNING and in_flight <= 1 and not request.fork_pending
            and seq.num_computed_tokens == len(seq.token_ids) + in_flight - 1 and seq.pending_candidates is None
            and p.beam_width == 1 and p.logprobs is None and not p.constrained and not p.stop
            and _row_controls(request) is None)


def _backs_off(seq: Sequence) -> bool:
    """Whether `seq` skips drafting this step after verify steps that accepted nothing (counts the step down)."""
    if not seq.spec_skip_steps:
        return False
    seq.spec_skip_steps -= 1
    return True


def _needs_prompt_logits(request: Request) -> bool:
    """Whether the request still needs some of its prompt's logits (prompt logprobs not all recorded)."""
    return request.prompt_logprobs is not None and len(request.prompt_logprobs) < len(request.prompt_token_ids)


def _record_prompt_logprobs(out: SchedulerOutput, result: ModelOutput) -> None:
    """Append each span's prompt logprobs to its request (positions already recorded are skipped)."""
    values = result.prompt_logprobs.tolist()
    offset = 0
    for i, start, count in out.prompt_logprob_spans:
        seq = out.seqs[i]
        request = seq.request
        recorded = request.prompt_logprobs
        k = request.params.prompt_logprobs
        prompt = request.prompt_token_ids
        first = len(recorded) - 1 - start  # entry p + 1 scores prompt token p + 1; earlier ones are in
        if seq.status is not SeqStatus.FINISHED and first >= 0:
            for j in range(first, count):
                row = offset + j
                recorded.append(_logprob_entry(prompt[start + j + 1], values[row], result.prompt_top_ids,
                                               result.prompt_top_logprobs, row, k))
        offset += count


def _logprob_entry(token: int, logprob: float, top_ids, top_logprobs, row: int, k: int) -> dict[int, float]:
    """{token id: logprob} for the k most likely ids of `row` and the actual token."""
    entry = {}
    if k:
        entry = dict(zip(top_ids[row, :k].tolist(), top_logprobs[row, :k].tolist()))
    entry[token] = logprob
    return entry


def _stop_reason(seq: Sequence, token: int) -> str | None:
    request = seq.request
    if token in request.stop_token_ids:
        return "stop"
    if len(seq.token_ids) >= request.max_len:
        return "length"
    return None


def _input_tokens(tokens: list[int], start: int, end: int) -> list[int]:
    """Tokens `[start, end)`; the last one may still be on the device (the previous step's sample)."""
    chunk = tokens[start:end]
    if len(chunk) < end - start:
        assert len(chunk) == end - start - 1, "only the previous step's sample can be unknown"
        chunk.append(TOKEN_ON_DEVICE)
    return chunk


def _new_row(seq: Sequence, block_ids: list[int]) -> NewRow:
    request = seq.request
    p = request.params
    return NewRow(seq.seq_id, block_ids, len(request.prompt_token_ids),
                  temperature=0.0 if p.beam_width > 1 else p.temperature, top_k=p.top_k, top_p=p.top_p,
                  seed=sequence_seed(request.base_seed, seq.index), controls=_row_controls(request),
                  min_p=p.min_p)


def _row_controls(request: Request) -> RowControls | None:
    """The request's logit controls for the runner's row; None when it uses none (the common case)."""
    p = request.params
    if not (p.logit_bias or p.min_tokens or p.uses_penalties or request.bad_words_token_ids):
        return None
    return RowControls(logit_bias=tuple((p.logit_bias or {}).items()), min_tokens=p.min_tokens,
                       stop_ids=tuple(sorted(request.stop_token_ids)) if p.min_tokens else (),
                       repetition=p.repetition_penalty, frequency=p.frequency_penalty,
                       presence=p.presence_penalty, bad_words=request.bad_words_token_ids)


__all__ = ["Scheduler", "SchedulerConfig", "beam_score"]
