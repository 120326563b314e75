"""Continuous-batching scheduler that speaks in token budgets.

Each step: running sequences first (decodes and unfinished prefill chunks, in
arrival order), then waiting ones admitted FCFS while the token budget, the
sequence cap and free blocks allow. When a running sequence cannot get a
block, the latest-arrived running request is preempted by recompute: its
blocks are freed (cached full blocks stay in the prefix cache) and it rejoins
the front of the queue, where resuming re-hits those blocks. In swap mode
(``preemption_mode="swap"``, needs the host tier) its computed blocks are first
copied to the host and copied back on resume instead of being recomputed.

With lower tiers (``tiers``), admission continues a prefix match into the host
(and disk) tier: those blocks are copied into freshly allocated device blocks
and committed as computed before the step runs.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses

from jaxpaged.cache import KVCacheManager
from jaxpaged.sequence import Request, Sequence, SeqStatus


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """Limits on one step's batch."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}")


@dataclasses.dataclass
class SchedulerOutput:
    """One step's work: which sequences compute how many tokens, and the CoW copies to apply first."""

    scheduled: list[tuple[Sequence, int]]
    copies: list[tuple[int, int]]
    preempted: list[Request]

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    """Decides each step's batch; owns the waiting queue and the running list."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, tiers=None,
                 preemption_mode: str = "recompute"):
        """`tiers` (a `jaxpaged.offload.KVTiers`) adds the host/disk tier; swap mode needs it."""
        if preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {preemption_mode!r}")
        if preemption_mode == "swap" and tiers is None:
            raise ValueError("preemption_mode='swap' needs the host tier: set host_cache_bytes")
        self.config = config
        self.kv = kv
        self.tiers = tiers
        self.preemption_mode = preemption_mode
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence at the back."""
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """Register a sequence already holding blocks (a fork) as running."""
        seq.status = SeqStatus.RUNNING
        bisect.insort(self.running, seq, key=_arrival)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence and free its blocks."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.kv.free(seq.seq_id)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
            if self.tiers is not None:
                self.tiers.drop_swap(seq.seq_id)
        seq.status = SeqStatus.FINISHED

    def schedule(self) -> SchedulerOutput:
        """Pick this step's batch under the token budget."""
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        copies: list[tuple[int, int]] = []
        preempted: list[Request] = []

        for seq in list(self.running):  # kept in arrival order (insort), no per-step sort
            if seq.status is not SeqStatus.RUNNING or budget == 0:
                continue
            num_new = min(seq.num_schedulable_tokens, budget)
            if num_new == 0:
                continue
            seq_copies = self._allocate_or_preempt(seq, num_new, preempted)
            if seq_copies is None:
                continue  # seq itself was preempted
            copies.extend(seq_copies)
            scheduled.append((seq, num_new))
            budget -= num_new
        # a preemption may have hit a request scheduled earlier in this loop
        scheduled = [(s, n) for s, n in scheduled if s.status is SeqStatus.RUNNING]
        budget = self.config.max_num_batched_tokens - sum(n for _, n in scheduled)

        if not preempted:
            self._admit_waiting(budget, scheduled)
        return SchedulerOutput(scheduled, copies, preempted)

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, preempted: list[Request]):
        while True:
            seq_copies = self.kv.allocate_slots(seq.seq_id, num_new)
            if seq_copies is not None:
                return seq_copies
            victim = max((s.request for s in self.running), key=lambda r: r.arrival_order)
            self.preempt(victim)
            preempted.append(victim)
            if victim is seq.request:
                return None

    def preempt(self, request: Request) -> None:
        """Free every running sequence of `request` and put them at the front of the queue."""
        request.num_preemptions += 1
        self.num_preemptions += 1
        for seq in reversed(request.seqs):
            if seq.status is SeqStatus.RUNNING:
                self.running.remove(seq)
                if self.preemption_mode == "swap":
                    num_blocks = -(-seq.num_computed_tokens // self.kv.block_size)
                    self.tiers.swap_out(seq.seq_id, self.kv.block_table(seq.seq_id)[:num_blocks],
                                        seq.num_computed_tokens)
                self.kv.free(seq.seq_id)
                seq.num_computed_tokens = 0
                seq.status = SeqStatus.WAITING
                self.waiting.appendleft(seq)

    def _admit_waiting(self, budget: int, scheduled: list[tuple[Sequence, int]]) -> int:
        deferred = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            tokens = seq.token_ids[:seq.compute_limit] if seq.request.fork_pending else seq.token_ids
            match = self.kv.match_prefix(tokens, cache_salt=seq.request.cache_salt)
            restore = None
            if self.tiers is not None:
                restore = self.tiers.plan_restore(seq.seq_id, match, len(tokens), seq.compute_limit)
            num_restored = restore.num_tokens if restore else 0
            if match.num_pending_tokens > 0 and not num_restored and (self.running or scheduled):
                # Another running sequence is computing this prefix right now: wait a step
                # and hit its blocks instead of computing them twice.
                deferred.append(self.waiting.popleft())
                continue
            num_cached = match.num_cached_tokens + num_restored
            num_new = min(seq.compute_limit - num_cached, budget)
            if num_new <= 0:
                num_new = 0
            if not self.kv.allocate_new(seq.seq_id, tokens, num_restored + num_new, match,
                                        cache_salt=seq.request.cache_salt):
                break  # not enough free blocks: FCFS, so nobody behind it goes first
            self.waiting.popleft()
            if self.tiers is not None:
                self.tiers.admitted(seq.seq_id, restore)
            if num_restored:  # the device copy lands before the step: count those tokens as computed
                self.kv.commit(seq.seq_id, tokens, num_cached)
            seq.num_computed_tokens = num_cached
            seq.status = SeqStatus.RUNNING
            bisect.insort(self.running, seq, key=_arrival)
            if seq.request.num_cached_tokens is None:
                seq.request.num_cached_tokens = num_cached
            if num_new:
                scheduled.append((seq, num_new))
                budget -= num_new
        self.waiting.extendleft(reversed(deferred))
        return budget


def _arrival(seq: Sequence) -> tuple[int, int]:
    return seq.request.arrival_order, seq.index
