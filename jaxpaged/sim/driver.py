"""Run a workload through the real engine over the simulated runner, in simulated time.

Requests are submitted when the simulated clock reaches their arrival time; a
multiturn turn is submitted once the previous turn of its conversation has
finished (its prompt then includes that turn's answer). When nothing is in
flight the clock jumps to the next arrival. While every running sequence is a
plain decode, steps are taken in jumps (`Engine.fast_forward`; arrivals
still go through the scheduler's own admission), with the same outcome as
stepping through them.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
import time

from jaxpaged.config import ModelConfig
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.metrics import kv_residency_summary
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.gc_tuning import collect_cycles_rarely
from jaxpaged.sim.runner import SimClock, SimulatedRunner
from jaxpaged.sim.workloads import ConversationHistory, WorkloadRequest

# A jump of fewer steps costs more than it saves (every running sequence is turned into a lane and
# back); after one, take this many ordinary steps before trying again. A refusal (not every running
# sequence is a plain decode) costs only that check, so the driver tries again after the next step.
# Either way the result is the same.
_FAST_FORWARD_MIN_STEPS = 4
_FAST_FORWARD_BACKOFF_STEPS = 16


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """What the simulation keeps of one finished request (simulated seconds)."""

    request_id: str
    arrival_time: float
    ttft: float
    e2e_latency: float
    tpot: float | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_preemptions: int


@dataclasses.dataclass
class SimResult:
    """One simulated run: per-request records and engine-wide counters."""

    records: list[RequestRecord]
    duration_s: float  # simulated, first arrival to last finish
    busy_s: float  # simulated time the device spent in steps
    num_steps: int
    num_preemptions: int
    prefix_hit_rate: float  # prompt tokens served from the cache / prompt tokens looked up
    output_tokens: int
    wall_s: float  # real seconds the simulation took
    kv_residency: dict = dataclasses.field(default_factory=dict)  # jaxpaged.metrics.kv_residency_summary

    @property
    def throughput_rps(self) -> float:
        """Finished requests per simulated second."""
        return len(self.records) / self.duration_s if self.duration_s > 0 else float("inf")


def make_sim_engine(engine_config: EngineConfig, model_config: ModelConfig, cost_model: CostModel, *,
                    runner_type: type[SimulatedRunner] = SimulatedRunner) -> tuple[Engine, SimClock]:
    """An engine whose runner is simulated (a `runner_type`) and whose clock is the simulation's.

    Scheduling is synchronous: the simulated device has no host work to hide,
    steps run back to back either way, and the decode fast-forward replays the
    synchronous engine.
    """
    clock = SimClock()
    engine_config = dataclasses.replace(engine_config, async_scheduling=False)
    num_blocks = engine_config.resolve_num_blocks(model_config, model_config.dtype)
    runner = runner_type(model_config, cost_model, clock, num_blocks=num_blocks)
    return Engine(engine_config, runner=runner, clock=clock), clock


@collect_cycles_rarely()
def simulate(engine: Engine, clock: SimClock, requests: list[WorkloadRequest], *,
             decode_fast_forward: bool = True) -> SimResult:
    """Serve `requests` (fixed output lengths, ignore_eos) until all finish; see the module docstring.

    `decode_fast_forward=False` runs every step through `engine.step()` (same
    result, slower; for checking the fast path).
    """
    wall_start = time.perf_counter()
    start = clock()
    later_turns = collections.defaultdict(dict)  # conversation -> turn -> request
    ready: list[tuple[float, int, WorkloadRequest]] = []
    for order, r in enumerate(requests):
        if r.conversation_id is not None and r.turn > 0:
            later_turns[r.conversation_id][r.turn] = r
        else:
            ready.append((start + r.arrival_time, order, r))
    # a turn's finish submits the next turn: fast-forwarding must stop there
    has_next_turn = {r.request_id for r in requests
                     if r.conversation_id is not None and r.turn + 1 in later_turns[r.conversation_id]}
    heapq.heapify(ready)
    order = len(requests)
    history = ConversationHistory()
    in_flight: dict[str, tuple[WorkloadRequest, list[int]]] = {}
    records: list[RequestRecord] = []
    output_tokens = 0
    def submit_due() -> float:
        """Submit every request due by now; return the next arrival time (inf: none queued)."""
        while ready and ready[0][0] <= clock():
            arrival, _, r = heapq.heappop(ready)
            prompt = history.full_prompt(r)
            engine.add_request(r.request_id, {"prompt_token_ids": prompt, "cache_salt": r.cache_salt},
                               SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True,
                                              detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY),
                               arrival_time=arrival)
            in_flight[r.request_id] = (r, prompt)
        return ready[0][0] if ready else math.inf

    skip_fast_forward = 0  # engine steps to take before trying fast_forward again
    while ready or in_flight:
        next_arrival = submit_due()
        if not in_flight:
            clock.advance_to(next_arrival)
            continue
        num_steps = 0
        if decode_fast_forward and not skip_fast_forward:
            num_steps, finished = engine.fast_forward(feed=submit_due, stop_after=has_next_turn)
            if 0 < num_steps < _FAST_FORWARD_MIN_STEPS:
                skip_fast_forward = _FAST_FORWARD_BACKOFF_STEPS
        if not num_steps:
            skip_fast_forward = max(skip_fast_forward - 1, 0)
            finished = engine.step()
            if not engine.stats.last_step_batch and not finished:
                if not ready:
                    raise RuntimeError("the engine scheduled nothing with requests in flight")
                clock.advance_to(ready[0][0])
        for out in finished:
            r, prompt = in_flight.pop(out.request_id)
            tokens = out.outputs[0].token_ids
            output_tokens += len(tokens)
            m = out.metrics
            records.append(RequestRecord(r.request_id, m.arrival_time, m.ttft, m.e2e_latency, m.tpot,
                                         len(prompt), out.num_cached_tokens, m.num_preemptions))
            if r.conversation_id is not None:
                history.record(r, prompt, tokens)
                nxt = later_turns[r.conversation_id].pop(r.turn + 1, None)
                if nxt is not None:
                    order += 1
                    heapq.heappush(ready, (max(start + nxt.arrival_time, clock()), order, nxt))
    stats = engine.kv_stats()
    first = min((rec.arrival_time for rec in records), default=start)
    return SimResult(
        records=records,
        duration_s=clock() - first,
        busy_s=engine.device_busy_s(),
        num_steps=engine.stats.num_steps,
        num_preemptions=engine.num_preemptions,
        prefix_hit_rate=stats.prefix_hits_tokens / stats.prefix_queries_tokens if stats.prefix_queries_tokens else 0.0,
        output_tokens=output_tokens,
        wall_s=time.perf_counter() - wall_start,
        kv_residency=kv_residency_summary(engine),
    )
