"""Decode fast-forward: run many predictable steps at once, exactly as `Engine.step` would.

`Engine.fast_forward` is the entry point. With a runner whose steps are
predictable (`capabilities.predictable_steps`, a `PredictableRunner`: the simulator's `SimulatedRunner` samples
one fixed token, `token`, and costs each step by its cost model on its clock)
once every running sequence is a plain decode,
each following step is predictable for them: every one computes one token and
the clock moves by the cost model's step time. What changes from step to step
is sparse: a sequence needs a fresh block once every `block_size` steps, fills
a block (commit: hash and publish it) once every `block_size` steps, and
finishes once. `fast_forward` keeps those sequences as *lanes* and applies
only their events, in the order the step-by-step engine does (per step:
allocations in running order, then commits and finishes in running order).

Arrivals go through the real scheduler: before each step `feed` submits the
requests due by then (what the driver does between steps), and each step
calls the scheduler's own admission (`Scheduler.schedule_waiting`) with the
budget the lanes leave, exactly as `Scheduler.schedule` would after scheduling
them, and applies that step's results to the admitted sequences with the
scheduler's own `update_from_output`. An admitted request whose prompt is
computed in that step becomes a lane from the next step on.

The engine, its KV cache manager and the clock end in the same state as
after the same steps one by one, block ids and float timestamps included
(`tests/engine/test_fast_forward.py`). It stops before a step that would go
differently (more fresh blocks needed than are free: the scheduler would
preempt; the clock at `until`), and after a step that leaves a running
sequence that is not a plain decode (a prefill chunk that did not finish its
prompt, a fork), or in which a request in `stop_after` finished (a multiturn
conversation's next turn arrives then). It only runs a synchronous engine
(no step in flight), as the simulator's engines are.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Callable, Container

import numpy as np

from jaxpaged.cache import KVCacheManager, KVManager
from jaxpaged.runner import Runner
from jaxpaged.scheduler import ModelOutput, Scheduler, SchedulerOutput
from jaxpaged.sequence import Request, Sequence, SeqStatus


@dataclasses.dataclass(slots=True, eq=False)  # eq=False: lanes are hashed by identity
class _Lane:
    """A plain decode; step j (> start) computes its token at position c0 + j - 1."""

    pos: tuple[int, int]  # (arrival order, index): the running list's order, the order of events in a step
    seq: Sequence
    c0: int
    start: int  # the step before its first lane step (0: a lane from the start)
    finish_step: int  # the step whose appended token ends it (max_tokens or max_model_len)


def run_plain_decodes(scheduler: Scheduler, kv: KVCacheManager, runner: Runner, *,
                      feed: Callable[[], float] | None = None, until: float = math.inf,
                      stop_after: Container[str] = ()) -> tuple[int, list[Request]]:
    """Run steps while every running sequence is a plain decode; see the module docstring.

    The caller (`Engine.fast_forward`) has checked `can_run_plain_decodes` and
    that no step is in flight. `feed()`, if given, is called before each step:
    it submits the requests due by now and returns the next arrival time.
    Without it, no step starts at or after `until`. Returns (steps run, every
    request those steps advanced, for the engine's output processing).
    """
    run = _DecodeRun(scheduler, kv, runner)
    steps = run.advance(feed, until, stop_after)
    return steps, list(run.advanced) if steps else []


def can_run_plain_decodes(scheduler: Scheduler, kv: KVManager, runner: Runner) -> bool:
    """Whether every running sequence is a plain decode of a predictable runner's token (and can be a lane)."""
    if not runner.capabilities.predictable_steps or not kv.unitary:
        return False
    if not scheduler.running or len(scheduler.running) > scheduler.config.max_num_batched_tokens:
        return False  # nothing to run, or the budget would leave some sequences out of a step
    return all(_is_plain_decode(seq, runner.token) for seq in scheduler.running)


class _DecodeRun:
    """The running sequences as lanes, and their next events bucketed by step number."""

    def __init__(self, scheduler: Scheduler, kv: KVCacheManager, runner: Runner):
        self.scheduler, self.kv, self.runner = scheduler, kv, runner
        self.decode_step_time = runner.cost_model.decode_step_time
        self.allocs, self.commits, self.finishes = (collections.defaultdict(list) for _ in range(3))
        self.active: dict[tuple[int, int], _Lane] = {}
        self.ended: tuple[int, list[_Lane]] = (0, [])  # the last step in which lanes finished, and those lanes
        self.total_c0 = 0  # sum of active lanes' c0: their contexts before step j sum to this + len * (j - 1)
        self.max_c0 = -math.inf
        self.times: list[float] = []  # end of each step run: the token times of its sequences
        self.last_admitted: SchedulerOutput | None = None
        self.advanced: dict[Request, None] = {}  # requests of every lane and every admitted sequence
        for seq in scheduler.running:
            self._add_lane(seq, 0)

    def _add_lane(self, seq: Sequence, step: int) -> None:
        """Make `seq`, a plain decode after `step` steps, a lane; schedule its first events."""
        bs = self.kv.block_size
        c0 = seq.num_computed_tokens - step
        finish = step + seq.request.max_len - seq.num_tokens
        lane = _Lane((seq.request.arrival_order, seq.index), seq, c0, step, finish)
        self.active[lane.pos] = lane
        self.advanced[seq.request] = None
        self.total_c0 += c0
        self.max_c0 = max(self.max_c0, c0)
        self.finishes[finish].append(lane)
        first_alloc = self.kv.num_blocks_held(seq.seq_id) * bs - c0 + 1  # first step writing past the table
        if first_alloc <= finish:
            self.allocs[first_alloc].append(lane)
        first_commit = step + bs - seq.num_computed_tokens % bs  # first step that fills a block
        if first_commit <= finish:
            self.commits[first_commit].append(lane)

    def advance(self, feed: Callable[[], float] | None, until: float, stop_after: Container[str]) -> int:
        """Run steps 1, 2, ... while they stay predictable; returns how many ran."""
        clock, kv, waiting = self.runner.clock, self.kv, self.scheduler.waiting
        allocs, commits, finishes = self.allocs, self.commits, self.finishes
        step = 0
        while self.active:
            if feed is not None:
                until = feed()
            if clock() >= until:
                break
            j = step + 1
            growing, committing, ending = allocs.pop(j, ()), commits.pop(j, ()), finishes.pop(j, ())
            if len(growing) > kv.num_free_blocks:
                break  # the scheduler would preempt: leave this step to Engine.step() (the run is dropped)
            if growing:
                self._allocate(j, growing)
            admitted = self._admit() if waiting else None
            self._run_step(j, admitted)
            step = j
            stop = bool(committing or ending) and self._commit_and_finish(j, committing, ending, stop_after)
            if admitted is not None and self._process_admitted(j, admitted, stop_after):
                stop = True
            if stop:
                break
        for lane in self.active.values():
            self._settle(lane, step)
        if step:  # the last step's batch: its lanes in running order, then what it admitted
            lanes = [lane for lane in self.active.values() if lane.start < step]
            lanes += self.ended[1] if self.ended[0] == step else []
            lanes.sort(key=_pos)
            admitted = self.last_admitted
            self.scheduler.stats.set_last_batch([lane.seq for lane in lanes] + (admitted.seqs if admitted else []),
                                                [1] * len(lanes) + (admitted.num_tokens if admitted else []))
        return step

    def _allocate(self, j: int, growing: list[_Lane]) -> None:
        """The scheduler's decode part of step j: a fresh block for each lane writing past its table."""
        bs = self.kv.block_size
        for lane in sorted(growing, key=_pos):
            update = self.kv.allocate_slots(lane.seq.seq_id, 1, num_computed_tokens=lane.c0 + j - 1)
            assert not update.copies, "plain decodes own their last block: no copy-on-write"
            if j + bs <= lane.finish_step:
                self.allocs[j + bs].append(lane)

    def _admit(self) -> SchedulerOutput | None:
        """The scheduler's admission with the budget the lanes leave (Scheduler.schedule's last part)."""
        scheduler = self.scheduler
        admitted = scheduler.schedule_waiting(scheduler.config.max_num_batched_tokens - len(self.active))
        if not admitted.seqs:
            return None
        if any(seq.request.use_beam_search for seq in admitted.seqs):
            raise NotImplementedError("the simulator does not model beam search")
        return admitted

    def _run_step(self, j: int, admitted: SchedulerOutput | None) -> None:
        """The device's part of step j: each lane computes one token, each admitted sequence its chunk."""
        num_lanes, runner, stats = len(self.active), self.runner, self.scheduler.stats
        self.last_admitted = admitted
        if admitted is not None:
            seconds = runner.cost_model.step_time([(1, lane.c0 + j - 1) for lane in self.active.values()]
                                                  + list(zip(admitted.num_tokens, admitted.starts)))
            stats.last_step_tokens = num_lanes + admitted.num_batched_tokens
        else:
            seconds = self.decode_step_time(num_lanes, self.total_c0 + num_lanes * (j - 1), self.max_c0 + j - 1)
            stats.last_step_tokens = num_lanes
        runner.account_step(seconds)
        self.times.append(runner.clock.now)
        stats.num_steps += 1
        stats.generation_tokens += num_lanes  # admitted sequences count theirs in update_from_output
        stats.last_step_seqs = num_lanes + (admitted.num_seqs if admitted is not None else 0)

    def _commit_and_finish(self, j: int, committing, ending, stop_after: Container[str]) -> bool:
        """The engine's processing of the lanes in step j, in running order; True if a `stop_after` finished."""
        if not ending:  # most steps: lanes filling a block, none finishing
            for lane in sorted(committing, key=_pos):
                self._commit_block(lane, j)
            return False
        now = self.times[-1]
        ends = {lane.pos for lane in ending}
        self.ended = (j, list(ending))
        stop = new_max = False
        fills = {lane.pos for lane in committing}
        for lane in sorted({*committing, *ending}, key=_pos):
            if lane.pos in ends:
                if lane.pos in fills:  # its last step filled a block: committed before the finish
                    self._commit_block(lane, j)
                self._settle(lane, j)
                self.scheduler.finish_seq(lane.seq, "length", now)
                del self.active[lane.pos]
                self.total_c0 -= lane.c0
                new_max = new_max or lane.c0 == self.max_c0
                stop = stop or lane.seq.request.request_id in stop_after
            else:
                self._commit_block(lane, j)
        if new_max:  # a finished lane may have had the longest context
            self.max_c0 = max((lane.c0 for lane in self.active.values()), default=-math.inf)
        return stop

    def _commit_block(self, lane: _Lane, j: int) -> None:
        """Step j filled a block of `lane`: commit it (hash, publish) and schedule its next fill."""
        if j + self.kv.block_size <= lane.finish_step:
            self.commits[j + self.kv.block_size].append(lane)
        self._extend_tokens(lane, j - 1)
        self.kv.commit(lane.seq.seq_id, lane.seq.token_ids, lane.c0 + j)

    def _extend_tokens(self, lane: _Lane, steps_done: int) -> None:
        """Give the sequence the tokens it holds after `steps_done` steps (its K/V: `c0 + steps_done`)."""
        seq = lane.seq
        missing = lane.c0 + 1 + steps_done - len(seq.token_ids)
        if missing > 0:
            seq.token_ids.extend([self.runner.token] * missing)

    def _settle(self, lane: _Lane, steps_done: int) -> None:
        """Bring a sequence and its request up to date after `steps_done` steps."""
        self._extend_tokens(lane, steps_done)
        seq = lane.seq
        seq.num_computed_tokens = lane.c0 + steps_done
        if seq.index == 0:
            seq.request.token_times.extend(self.times[lane.start:steps_done])

    def _process_admitted(self, j: int, admitted: SchedulerOutput, stop_after: Container[str]) -> bool:
        """The scheduler's update from step j for the admitted sequences (after the lanes, as scheduled).

        New plain decodes become lanes; True if the run must stop after this step.
        """
        token, n = self.runner.token, admitted.num_seqs
        result = ModelOutput(token_ids=np.full(n, token, np.int32), logprobs=np.zeros(n, np.float32))
        for request in self.scheduler.update_from_output(admitted, result, self.times[-1]):
            self.advanced[request] = None
        stop = False
        for seq in admitted.seqs:
            request = seq.request
            if request.finish_time is not None:
                stop = stop or request.request_id in stop_after
            elif _is_plain_decode(seq, token):
                self._add_lane(seq, j)
            else:
                stop = True  # a prompt chunk still to go, or forks: the full scheduler's work
        return stop


def _is_plain_decode(seq: Sequence, token: int) -> bool:
    """One running sequence of its request, decoding one token per step, never stopped by `token`.

    Its one uncomputed token is a generated one: a prompt one token from done
    (a chunk stopped there) would compute a prompt token and sample the first
    output token, which is not a decode step's bookkeeping.
    """
    request = seq.request
    if (seq.status is not SeqStatus.RUNNING or len(request.seqs) != 1 or request.fork_pending
            or request.use_beam_search or seq.num_computed_tokens != seq.num_tokens - 1
            or seq.num_computed_tokens < len(request.prompt_token_ids) or seq.pending_candidates is not None):
        return False
    return token not in request.stop_token_ids


def _pos(lane: _Lane) -> tuple[int, int]:
    return lane.pos
