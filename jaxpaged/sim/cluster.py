"""Data-parallel replicas behind a router, simulated: N engines over `SimulatedRunner` on one timeline.

Each replica is an engine over the simulated runner with its own `SimClock`,
the time its device has reached. One loop keeps them on a single simulated
timeline: it always takes the earliest thing due, either the next arrival or
the step of the replica whose clock is furthest behind. An arrival is routed
at its time with the replicas' loads then, and with the KV events they had
published by then: a replica's events from a step are delivered at the step's
end. A replica with nothing to do idles; its clock jumps to the arrival it gets
next. Multiturn turns arrive after their previous turn finished, as in
`jaxpaged.sim.driver`.

Steps are taken one at a time (no decode fast-forward: jumping one replica
ahead would route later arrivals against stale loads).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time

import numpy as np

from jaxpaged.outputs import RequestOutputKind
from jaxpaged.router import ReplicaLoad, RequestHasher, Router
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.driver import RequestRecord, make_sim_engine
from jaxpaged.sim.gc_tuning import collect_cycles_rarely
from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.workloads import ConversationHistory, WorkloadRequest


@dataclasses.dataclass
class ClusterResult:
    """One simulated cluster run (simulated seconds, except `wall_s`)."""

    records: list[RequestRecord]
    replica_of: dict[str, int]  # request id -> replica that served it
    num_replicas: int
    duration_s: float  # first arrival to last finish
    wall_s: float

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens served from a replica's prefix cache over all prompt tokens."""
        prompt = sum(r.num_prompt_tokens for r in self.records)
        return sum(r.num_cached_tokens for r in self.records) / prompt if prompt else 0.0

    @property
    def throughput_rps(self) -> float:
        """Finished requests per simulated second."""
        return len(self.records) / self.duration_s if self.duration_s > 0 else math.inf

    def goodput_rps(self, ttft_slo_s: float, tpot_slo_s: float) -> float:
        """Requests per simulated second that met both SLOs (TTFT, and TPOT when they decoded)."""
        good = sum(1 for r in self.records
                   if r.ttft <= ttft_slo_s and (r.tpot is None or r.tpot <= tpot_slo_s))
        return good / self.duration_s if self.duration_s > 0 else math.inf

    def load_imbalance(self) -> float:
        """Requests served by the busiest replica over the mean per replica (1 = even)."""
        counts = np.bincount(list(self.replica_of.values()), minlength=self.num_replicas)
        return float(counts.max() / counts.mean()) if len(self.replica_of) else 1.0

    def summary(self, ttft_slo_s: float, tpot_slo_s: float) -> dict:
        """The run's headline numbers, JSON-ready."""
        ttft = np.array([r.ttft for r in self.records])
        tpot = np.array([r.tpot for r in self.records if r.tpot is not None])
        return {
            "num_replicas": self.num_replicas,
            "requests": len(self.records),
            "prefix_hit_rate": self.prefix_hit_rate,
            "throughput_rps": self.throughput_rps,
            "goodput_rps": self.goodput_rps(ttft_slo_s, tpot_slo_s),
            "ttft_p50_s": float(np.percentile(ttft, 50)),
            "ttft_p99_s": float(np.percentile(ttft, 99)),
            "tpot_p50_s": float(np.median(tpot)) if len(tpot) else None,
            "load_imbalance": self.load_imbalance(),
            "preemptions": sum(r.num_preemptions for r in self.records),
            "wall_s": self.wall_s,
        }


def _load(engine) -> ReplicaLoad:
    return engine.load()


@collect_cycles_rarely()
def simulate_cluster(deployment: Deployment, num_replicas: int, policy,
                     requests: list[WorkloadRequest]) -> ClusterResult:
    """Serve `requests` (arrival times set, fixed output lengths) on `num_replicas` simulated replicas.

    `policy` is a `jaxpaged.router` policy; the router's index is fed by the
    replicas' KV events. Returns when every request has finished.
    """
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    wall_start = time.perf_counter()
    engine_config, model_config = deployment.engine_config(), deployment.model_config
    engines, clocks = [], []
    router = Router(policy, RequestHasher(deployment.block_size, deployment.hash_algo))
    for index in range(num_replicas):
        engine, clock = make_sim_engine(engine_config, model_config, deployment.cost_model())
        engine.enable_kv_events()
        engines.append(engine)
        clocks.append(clock)
        router.add_replica(index)

    later_turns: dict[str, dict[int, WorkloadRequest]] = {}
    arrivals: list[tuple[float, int, WorkloadRequest]] = []
    for order, r in enumerate(requests):
        if r.conversation_id is not None and r.turn > 0:
            later_turns.setdefault(r.conversation_id, {})[r.turn] = r
        else:
            arrivals.append((r.arrival_time, order, r))
    heapq.heapify(arrivals)
    order = len(requests)
    published: list[tuple[float, int, int, list]] = []  # (time, seq, replica, events): delivered in time order
    num_published = 0
    busy: list[tuple[float, int]] = []  # (replica clock, replica) of replicas with unfinished requests
    is_busy = [False] * num_replicas
    history = ConversationHistory()
    prompts: dict[str, tuple[WorkloadRequest, list[int]]] = {}
    replica_of: dict[str, int] = {}
    records: list[RequestRecord] = []

    def deliver_events(now: float) -> None:
        while published and published[0][0] <= now:
            _, _, replica, events = heapq.heappop(published)
            router.on_events(replica, events)

    def route(now: float, r: WorkloadRequest) -> None:
        deliver_events(now)
        prompt = history.full_prompt(r)
        replica = router.route(prompt, {i: _load(e) for i, e in enumerate(engines)}, cache_salt=r.cache_salt)
        clocks[replica].advance_to(now)  # an idle replica's device waited until now
        engines[replica].add_request(
            r.request_id, {"prompt_token_ids": prompt, "cache_salt": r.cache_salt},
            SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True, detokenize=False,
                           output_kind=RequestOutputKind.FINAL_ONLY),
            arrival_time=now)
        prompts[r.request_id] = (r, prompt)
        replica_of[r.request_id] = replica
        if not is_busy[replica]:
            is_busy[replica] = True
            heapq.heappush(busy, (clocks[replica](), replica))

    while arrivals or busy:
        if arrivals and (not busy or arrivals[0][0] <= busy[0][0]):
            now, _, r = heapq.heappop(arrivals)
            route(now, r)
            continue
        _, replica = heapq.heappop(busy)
        engine, clock = engines[replica], clocks[replica]
        finished = engine.step()
        now = clock()
        events = engine.take_kv_events()
        if events:
            num_published += 1
            heapq.heappush(published, (now, num_published, replica, events))
        if not engine.stats.last_step_batch and not finished:
            raise RuntimeError(f"replica {replica} scheduled nothing with requests in flight")
        for out in finished:
            r, prompt = prompts.pop(out.request_id)
            m = out.metrics
            records.append(RequestRecord(r.request_id, m.arrival_time, m.ttft, m.e2e_latency, m.tpot,
                                         len(prompt), out.num_cached_tokens, m.num_preemptions))
            if r.conversation_id is not None:
                history.record(r, prompt, out.outputs[0].token_ids)
                nxt = later_turns.get(r.conversation_id, {}).pop(r.turn + 1, None)
                if nxt is not None:
                    order += 1
                    heapq.heappush(arrivals, (max(nxt.arrival_time, now), order, nxt))
        if engine.has_unfinished_requests():
            heapq.heappush(busy, (now, replica))
        else:
            is_busy[replica] = False
    first = min((rec.arrival_time for rec in records), default=0.0)
    last = max((rec.arrival_time + rec.e2e_latency for rec in records), default=0.0)
    return ClusterResult(records, replica_of, num_replicas, last - first, time.perf_counter() - wall_start)
