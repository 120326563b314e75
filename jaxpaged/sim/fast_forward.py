"""Decode fast-forward: run many predictable decode steps at once, exactly as `Engine.step` would.

In a simulation the runner's tokens are known in advance (`SimulatedRunner`
samples one fixed token), so once every running sequence is a plain decode and
nothing waits, each following step is predictable: every running sequence
computes one token and the clock moves by the cost model's decode time. What
changes from one step to the next is sparse: a sequence needs a fresh block
once every `block_size` steps, fills a block (commit: hash and publish it)
once every `block_size` steps, and finishes once. `fast_forward` jumps over
the steps in between and does those events in the order the step-by-step
engine does them (per step: allocations in running order, then commits and
finishes in running order). The engine, its KV cache manager and the clock end
in the same state as after the same steps one by one, block ids and float
timestamps included (`tests/sim/test_fast_forward.py` checks this).

It stops before any step that would go differently: the clock reaching
`until` (the driver's next arrival), a step needing more fresh blocks than are
free (the scheduler would preempt), or nothing left running; and right after
a step in which a request in `stop_after` finished (a multiturn
conversation's next turn arrives then).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Container

from jaxpaged.cache import KVCacheManager
from jaxpaged.engine import Engine
from jaxpaged.outputs import RequestOutput
from jaxpaged.sequence import Sequence
from jaxpaged.sim.runner import SimulatedRunner


@dataclasses.dataclass
class _Lane:
    """One running sequence during a fast-forward; step j computes its token at position c0 + j - 1."""

    pos: int  # place in the running list: the order events are applied in within a step
    seq: Sequence
    token: int  # what every step appends (the simulated runner's fixed token)
    c0: int  # tokens with K/V before the first fast-forwarded step
    finish_step: int  # the step whose appended token ends it (max_tokens or max_model_len)


def fast_forward(engine: Engine, *, until: float = math.inf,
                 stop_after: Container[str] = ()) -> tuple[int, list[RequestOutput]]:
    """Run decode-only steps until an event needs the full scheduler; see the module docstring.

    Returns (steps run, outputs of the requests that finished in them). Zero
    steps when the engine is not in a pure-decode state: call `engine.step()`.
    """
    if not _all_plain_decodes(engine):
        return 0, []
    kv, runner = engine.kv, engine.runner
    clock, cost, bs = runner.clock, runner.cost_model, kv.block_size
    lanes = []
    allocs, commits, finishes = (collections.defaultdict(list) for _ in range(3))
    for pos, seq in enumerate(engine.scheduler.running):
        c0 = seq.num_computed_tokens
        finish = min(seq.request.params.max_tokens - seq.num_output_tokens, engine.max_model_len - seq.num_tokens)
        lane = _Lane(pos, seq, runner.token, c0, finish)
        lanes.append(lane)
        finishes[finish].append(lane)
        first_alloc = kv.num_blocks_held(seq.seq_id) * bs - c0 + 1  # first step writing past the table
        if first_alloc <= finish:
            allocs[first_alloc].append(lane)
        first_commit = bs - c0 % bs  # first step that fills a block
        if first_commit <= finish:
            commits[first_commit].append(lane)

    active = {lane.pos: lane for lane in lanes}
    total_c0 = sum(lane.c0 for lane in lanes)
    max_c0 = max(lane.c0 for lane in lanes)
    times: list[float] = []  # end of each step run: the token times of its sequences
    step = 0
    stop = False
    while active and not stop and clock() < until:
        j = step + 1
        need = allocs.get(j, ())
        if len(need) > kv.num_free_blocks:
            break  # the scheduler would preempt: leave this step to engine.step()
        for lane in finishes.get(j, ()):
            engine._record_block_usage(lane.seq.request)  # as after step j - 1: the last it would see
        for lane in sorted(allocs.pop(j, ()), key=_pos):
            seq_id = lane.seq.seq_id
            copies = kv.allocate_slots(seq_id, lane.c0 + j - kv.num_computed_tokens(seq_id))
            assert copies == [], "plain decodes own their last block: no copy-on-write"
            if j + bs <= lane.finish_step:
                allocs[j + bs].append(lane)
        num_seqs = len(active)
        seconds = cost.decode_step_time(num_seqs, total_c0 + num_seqs * (j - 1), max_c0 + j - 1)
        clock.advance(seconds)
        runner.busy_s += seconds
        runner.num_steps += 1
        now = clock()
        times.append(now)
        step = j
        _count_step(engine, num_seqs)
        new_max = False  # a finished lane may have had the longest context
        committing = {lane.pos: lane for lane in commits.pop(j, ())}
        ending = {lane.pos: lane for lane in finishes.pop(j, ())}
        for pos in sorted(committing.keys() | ending.keys()):
            lane = committing.get(pos) or ending[pos]
            if pos in committing and j + bs <= lane.finish_step:
                commits[j + bs].append(lane)
            if pos in ending:
                _settle(engine, lane, j, times)
                engine._finish_seq(lane.seq, "length", now)
                del active[pos]
                total_c0 -= lane.c0
                new_max = new_max or lane.c0 == max_c0
                stop = stop or lane.seq.request.request_id in stop_after
            else:
                _extend_tokens(lane, j - 1)
                kv.commit(lane.seq.seq_id, lane.seq.token_ids, lane.c0 + j)
        if new_max and active:
            max_c0 = max(lane.c0 for lane in active.values())
    for lane in active.values():
        _settle(engine, lane, step, times)
        engine._record_block_usage(lane.seq.request)
    if step:
        engine.stats.last_step_batch = [(lane.seq.request.request_id, lane.seq.index, 1)
                                        for lane in lanes if lane.finish_step >= step]
    return step, engine._take_finished_outputs()


def _all_plain_decodes(engine: Engine) -> bool:
    """Whether the next step is a pure decode of every running sequence with the runner's known token."""
    runner, scheduler = engine.runner, engine.scheduler
    if not isinstance(runner, SimulatedRunner) or type(engine.kv) is not KVCacheManager:
        return False
    if engine.tiers is not None or engine.stat_loggers:  # loggers expect a call per step
        return False
    if scheduler.waiting or not scheduler.running:
        return False
    if len(scheduler.running) > scheduler.config.max_num_batched_tokens:
        return False  # the budget would leave some sequences out of a step
    token = runner.token
    for seq in scheduler.running:
        request, params = seq.request, seq.request.params
        if (len(request.seqs) != 1 or request.fork_pending or params.use_beam_search
                or seq.num_computed_tokens != seq.num_tokens - 1 or seq.pending_candidates is not None):
            return False
        if token in params.stop_token_ids or (not params.ignore_eos and token in engine.eos_token_ids):
            return False
    return True


def _count_step(engine: Engine, num_seqs: int) -> None:
    stats = engine.stats
    stats.num_steps += 1
    stats.generation_tokens += num_seqs
    stats.last_step_tokens = num_seqs
    stats.last_step_seqs = num_seqs


def _extend_tokens(lane: _Lane, steps_done: int) -> None:
    """Give the sequence the tokens it holds after `steps_done` steps (its K/V: `c0 + steps_done`)."""
    seq = lane.seq
    missing = lane.c0 + 1 + steps_done - len(seq.token_ids)
    if missing > 0:
        seq.token_ids.extend([lane.token] * missing)


def _settle(engine: Engine, lane: _Lane, steps_done: int, times: list[float]) -> None:
    """Bring a sequence and its request up to date after `steps_done` steps."""
    _extend_tokens(lane, steps_done)
    seq = lane.seq
    seq.num_computed_tokens = lane.c0 + steps_done
    engine.kv.commit(seq.seq_id, seq.token_ids, seq.num_computed_tokens)
    if seq.index == 0:
        seq.request.token_times.extend(times[:steps_done])


def _pos(lane: _Lane) -> int:
    return lane.pos
