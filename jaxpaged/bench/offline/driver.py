"""Drive an Engine through a workload with timed arrivals and record what happened.

``run_workload`` submits each request at its arrival time (relative to the
start), steps the engine until everything has finished, and samples KV usage
after every step. Time is the engine's clock: with a :class:`TimedRunner` it is
``perf_counter`` minus compile time, so latencies and throughput exclude
compiles (reported separately).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from jaxpaged.outputs import RequestOutput, RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.workloads import ConversationHistory, WorkloadRequest


@dataclasses.dataclass
class StepSample:
    """KV state right after one engine step."""

    usage: float
    filled_slots: int
    reserved_slots: int
    num_running: int


@dataclasses.dataclass
class RunRecord:
    """Everything a run produced: finished outputs, per-step samples, wall span and engine counters."""

    outputs: list[RequestOutput]
    samples: list[StepSample]
    start: float
    end: float
    num_preemptions: int
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    num_evictions: int
    spec_num_drafts: int = 0  # speculative decoding: verify steps' sequences, and drafts they accepted
    spec_num_accepted_tokens: int = 0


def _params(request: WorkloadRequest) -> SamplingParams:
    # greedy, fixed length: every mode generates exactly the same number of tokens
    return SamplingParams(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=True,
                          output_kind=RequestOutputKind.FINAL_ONLY)


def run_workload(engine, requests: Sequence[WorkloadRequest], *,
                 on_finish: Callable[[RequestOutput], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> RunRecord:
    """Run ``requests`` through ``engine`` (fresh: no unfinished requests) and return the record.

    A request is submitted once the engine clock passes ``start + arrival_time``
    (and, for a multiturn turn, once its previous turn finished); its arrival
    time is the scheduled one, so queueing before submission counts in TTFT.
    """
    clock = engine.clock
    history = ConversationHistory()
    pending = sorted(requests, key=lambda r: (r.arrival_time, r.turn))
    by_id = {r.request_id: r for r in requests}
    prompts: dict[str, list[int]] = {}
    outputs: list[RequestOutput] = []
    samples: list[StepSample] = []
    start = clock()
    while pending or engine.has_unfinished_requests():
        now = clock() - start
        still = []
        for r in pending:
            if r.arrival_time <= now and history.ready(r):
                prompts[r.request_id] = history.full_prompt(r)
                engine.add_request(r.request_id, prompts[r.request_id], _params(r),
                                   cache_salt=r.cache_salt, arrival_time=start + r.arrival_time)
            else:
                still.append(r)
        pending = still
        if not engine.has_unfinished_requests():
            next_arrival = min((r.arrival_time for r in pending), default=now)
            sleep(max(0.0, next_arrival - now))
            continue
        finished = engine.step()
        filled, reserved = engine.kv_slot_usage()
        samples.append(StepSample(engine.kv_stats().usage, filled, reserved, engine.load().num_running))
        for out in finished:
            request = by_id[out.request_id]
            history.record(request, prompts[out.request_id], out.outputs[0].token_ids)
            outputs.append(out)
            if on_finish is not None:
                on_finish(out)
    kv = engine.kv_stats()
    stats = engine.stats
    return RunRecord(outputs, samples, start, clock(), engine.num_preemptions,
                     kv.prefix_queries_tokens, kv.prefix_hits_tokens, kv.num_evictions,
                     stats.spec_num_drafts, stats.spec_num_accepted_tokens)
