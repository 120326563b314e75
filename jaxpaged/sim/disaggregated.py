"""Prefill and decode pools, simulated: each request is prefilled on one instance, then decoded on another.

`Pools` says how a deployment's instances (each `tensor_parallel_size` devices)
are used: all `colocated` (each runs whole requests, as `jaxpaged.sim.cluster`'s
replicas do), or split into `prefill` and `decode` pools. Every instance is an
engine over the simulated runner with its own `SimClock`; one loop keeps them
on a single timeline as `jaxpaged.sim.cluster` does (the earliest thing due
first: an arrival, a finished transfer, or the step of the instance whose clock
is furthest behind). Each pool has its own router (`jaxpaged.router`) fed by
its instances' KV events, delivered at the end of the step that made them.

A disaggregated request goes:

1. to a prefill instance (routed at its arrival), which computes the prompt
   and samples one token (`max_tokens=1`); its blocks stay in that
   instance's prefix cache;
2. to a decode instance, routed when the prefill finishes. What crosses the
   link is what the real KV connector pulls (`KVTiers.missing_prompt_blocks`,
   `jaxpaged.kv_transfer`): the prompt's full blocks (all but the last
   token's) that neither the instance's device prefix cache nor its host tier
   holds then, ``bytes = block_bytes x blocks``, taking
   ``bytes / kv_shards / bandwidth_per_device`` after the link is free
   (`jaxpaged.sim.kv_link`);
3. when the transfer is done the blocks land in the decode instance's host
   tier (`KVTiers.land`, as the connector lands them) and the request is
   submitted with its original arrival time. Admission restores them through
   the manager's one path for blocks computed elsewhere (`plan_extension` ->
   `allocate_new`) and commits them, so the step computes only the prompt's
   tail after its last full block (at least its last token), and later
   requests hit them (`jaxpaged.sim.pulled_kv`). That step samples the first
   token the client sees, and the decode instance generates the rest.

So a request's TTFT is its prefill-side queueing and prefill, the transfer
(with its wait for the link), the decode-side queueing and that first decode
step. As in vLLM's disaggregated serving, the prefill's own token is not sent
to the client. Multiturn turns arrive after the previous turn finished, as in
`jaxpaged.sim.driver`.

Decode (and colocated) instances whose running sequences are all plain
decodes, and (decode instances) with no request waiting to be admitted,
take their steps in jumps (`Engine.fast_forward`), up to the next thing due
anywhere in the loop: the next arrival or transfer, or the clock of the next
instance to step, so nothing is routed or submitted in between and the outcome
is the same as stepping one at a time (the KV events of a jump are published at
its end, before anything reads them).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time

import numpy as np

from jaxpaged.cache.kv_groups import kv_cache_layout
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.router import RequestHasher, Router, make_policy
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sim.driver import RequestRecord, make_sim_engine
from jaxpaged.sim.gc_tuning import collect_cycles_rarely
from jaxpaged.sim.kv_link import KVLink, LinkSchedule
from jaxpaged.sim.pulled_kv import NO_DATA_BLOCK_SHAPE, PulledKVRunner
from jaxpaged.sim.runner import SimulatedRunner
from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.slo import SLO, Attainment, attainment
from jaxpaged.sim.workloads import ConversationHistory, WorkloadRequest

_ARRIVAL, _HANDOFF = 0, 1


@dataclasses.dataclass(frozen=True)
class Pools:
    """How many instances do what: `colocated` ones run whole requests; else `prefill` + `decode` pools."""

    colocated: int = 0
    prefill: int = 0
    decode: int = 0

    def __post_init__(self):
        for name in ("colocated", "prefill", "decode"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if self.colocated and (self.prefill or self.decode):
            raise ValueError("instances are either colocated or split into prefill and decode pools, not both")
        if not self.colocated and (self.prefill < 1 or self.decode < 1):
            raise ValueError(f"a split needs at least one prefill and one decode instance, got "
                             f"{self.prefill} prefill and {self.decode} decode")

    @property
    def disaggregated(self) -> bool:
        return not self.colocated

    @property
    def num_instances(self) -> int:
        return self.colocated + self.prefill + self.decode

    @property
    def label(self) -> str:
        """"colocated x4" or "1P:3D"."""
        return f"colocated x{self.colocated}" if self.colocated else f"{self.prefill}P:{self.decode}D"


@dataclasses.dataclass(frozen=True)
class PoolRecord:
    """What the simulation keeps of one finished request (simulated seconds).

    `num_cached_tokens` is the prefix hit where the request was decoded (or
    run, colocated), not counting the blocks it pulled; `prefill_cached_tokens`
    the prefill instance's hit (None when colocated). `pulled_tokens` /
    `transfer_bytes` are what crossed the link; `transfer_wait_s` the time it
    waited for the link, `transfer_s` the time on it; `prefill_done` the time (from the request's arrival) its
    prefill instance sampled its token.
    """

    request_id: str
    arrival_time: float
    ttft: float
    e2e_latency: float
    tpot: float | None
    tbt_p90: float | None
    tbt_max: float | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    instance: int  # the decode (or colocated) instance, by index in its pool
    prefill_instance: int | None = None
    prefill_cached_tokens: int | None = None
    prefill_done: float | None = None
    pulled_tokens: int = 0
    transfer_bytes: float = 0.0
    transfer_wait_s: float = 0.0
    transfer_s: float = 0.0

    def request_record(self) -> RequestRecord:
        """The fields `jaxpaged.sim.driver` and `jaxpaged.sim.cluster` keep."""
        return RequestRecord(self.request_id, self.arrival_time, self.ttft, self.e2e_latency, self.tpot,
                             self.num_prompt_tokens, self.num_cached_tokens, self.num_preemptions)


@dataclasses.dataclass
class PoolsResult:
    """One simulated run of a deployment's pools (simulated seconds, except `wall_s`)."""

    pools: Pools
    records: list[PoolRecord]
    duration_s: float  # first arrival to last finish
    wall_s: float
    decode_recomputed_tokens: int = 0  # full-block prompt tokens a decode instance computed (evicted meanwhile)

    @property
    def throughput_rps(self) -> float:
        """Finished requests per simulated second."""
        return len(self.records) / self.duration_s if self.duration_s > 0 else math.inf

    def attainment(self, slo: SLO) -> Attainment:
        """SLO attainment and goodput (`jaxpaged.sim.slo`)."""
        return attainment(self.records, slo, self.duration_s)

    def summary(self, slo: SLO) -> dict:
        """The run's headline numbers, JSON-ready."""
        ttft = np.array([r.ttft for r in self.records])
        tbt = np.array([t for r in self.records if (t := slo.tbt(r)) is not None])
        prompt = sum(r.num_prompt_tokens for r in self.records)
        att = self.attainment(slo)
        return {
            "pools": self.pools.label,
            "prefill": self.pools.prefill, "decode": self.pools.decode, "colocated": self.pools.colocated,
            "requests": len(self.records),
            "throughput_rps": self.throughput_rps,
            "goodput_rps": att.goodput_rps,
            "slo_attainment": att.both, "ttft_attainment": att.ttft, "tbt_attainment": att.tbt,
            "ttft_p50_s": float(np.percentile(ttft, 50)) if len(ttft) else None,
            "ttft_p99_s": float(np.percentile(ttft, 99)) if len(ttft) else None,
            f"tbt_{slo.tbt_stat}_p50_s": float(np.percentile(tbt, 50)) if len(tbt) else None,
            f"tbt_{slo.tbt_stat}_p99_s": float(np.percentile(tbt, 99)) if len(tbt) else None,
            "prefix_hit_rate": sum(r.num_cached_tokens for r in self.records) / prompt if prompt else 0.0,
            "transfer_gb": sum(r.transfer_bytes for r in self.records) / 1e9,
            "transfer_s_p50": float(np.median([r.transfer_s for r in self.records])) if self.records else 0.0,
            "preemptions": sum(r.num_preemptions for r in self.records),
            "decode_recomputed_tokens": self.decode_recomputed_tokens,
            "duration_s": self.duration_s,
            "wall_s": self.wall_s,
        }


# as `jaxpaged.sim.driver`: after a jump of fewer steps, take this many ordinary steps before trying again
_FAST_FORWARD_MIN_STEPS = 4
_FAST_FORWARD_BACKOFF_STEPS = 16


@dataclasses.dataclass
class _Instance:
    pool: "_Pool"
    index: int  # within its pool
    engine: object
    clock: object
    runner: SimulatedRunner  # the engine's simulated runner, kept here: outside code asks the engine, not its parts
    busy: bool = False
    skip_fast_forward: int = 0  # ordinary steps to take before trying a jump again


class _Pool:
    """Instances of one role, their router and the KV events they published but the router has not seen."""

    def __init__(self, role: str, size: int, deployment: Deployment, engine_config, policy: str, offset: int,
                 runner_type: type[SimulatedRunner]):
        self.role = role
        self.router = Router(make_policy(policy), RequestHasher(deployment.block_size, deployment.hash_algo))
        self.instances = []
        for index in range(size):
            runners = []

            def keep_runner(*args, **kwargs) -> SimulatedRunner:
                runners.append(runner_type(*args, **kwargs))
                return runners[-1]

            engine, clock = make_sim_engine(engine_config, deployment.model_config, deployment.cost_model(),
                                            runner_type=keep_runner)
            engine.enable_kv_events()
            self.instances.append(_Instance(self, index, engine, clock, runners[0]))
            self.router.add_replica(index)
        self.offset = offset  # the instances' place in the loop's busy heap (ties break by it)
        self._published: list[tuple[float, int, int, list]] = []
        self._num_published = 0

    def publish(self, now: float, index: int, events: list) -> None:
        self._num_published += 1
        heapq.heappush(self._published, (now, self._num_published, index, events))

    def route(self, now: float, prompt: list[int], cache_salt: str | None) -> _Instance:
        """The instance for a request at `now`, chosen with the events published by then and the loads now."""
        while self._published and self._published[0][0] <= now:
            _, _, index, events = heapq.heappop(self._published)
            self.router.on_events(index, events)
        loads = {i.index: i.engine.load() for i in self.instances}
        return self.instances[self.router.route(prompt, loads, cache_salt=cache_salt)]


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False,
                          output_kind=RequestOutputKind.FINAL_ONLY)


def _gaps(token_times: list[float]) -> tuple[float | None, float | None]:
    """The 90th percentile and the largest gap between consecutive output tokens (None with fewer than two)."""
    if len(token_times) < 2:
        return None, None
    gaps = np.diff(np.asarray(token_times))
    return float(np.percentile(gaps, 90)), float(gaps.max())


def decode_engine_config(deployment: Deployment):
    """A decode instance's engine settings: a host tier of one pool's worth, where pulled blocks land (a real
    decode engine's default; `PulledKVRunner`'s blocks are one byte each), and a token budget that holds any
    whole prompt plus a decode per sequence, so a prompt whose blocks were lost is computed in one step."""
    config = deployment.engine_config()
    longest = min(deployment.model_config.max_position_embeddings, config.num_blocks * deployment.block_size)
    return dataclasses.replace(config, max_num_batched_tokens=max(config.max_num_batched_tokens,
                                                                  longest + config.max_num_seqs),
                               host_cache_bytes=config.num_blocks * int(np.prod(NO_DATA_BLOCK_SHAPE)))


@collect_cycles_rarely()
def simulate_pools(deployment: Deployment, pools: Pools, requests: list[WorkloadRequest], *, link: KVLink,
                   policy: str = "prefix_aware", decode_fast_forward: bool = True) -> PoolsResult:
    """Serve `requests` (arrival times set, fixed output lengths) on `pools` of `deployment`'s instances.

    `policy` (a `jaxpaged.router` policy name) routes within each pool;
    `link` prices the K/V transfers. `decode_fast_forward=False` takes every
    step one at a time (same result, slower). Returns when every request has finished.
    """
    wall_start = time.perf_counter()
    config = deployment.engine_config()
    if pools.colocated:
        front = _Pool("colocated", pools.colocated, deployment, config, policy, 0, SimulatedRunner)
        back = None
    else:
        front = _Pool("prefill", pools.prefill, deployment, config, policy, 0, SimulatedRunner)
        back = _Pool("decode", pools.decode, deployment, decode_engine_config(deployment), policy,
                     pools.prefill, PulledKVRunner)
    bs = deployment.block_size
    block_bytes = deployment.block_bytes()
    kv_shards = deployment.model_config.kv_shards(deployment.tensor_parallel_size)
    num_groups = kv_cache_layout(deployment.model_config.layer_windows).num_groups
    links = LinkSchedule()

    later_turns: dict[str, dict[int, WorkloadRequest]] = {}
    due: list[tuple[float, int, int, object]] = []  # (time, order, kind, payload)
    for order, r in enumerate(requests):
        if r.conversation_id is not None and r.turn > 0:
            later_turns.setdefault(r.conversation_id, {})[r.turn] = r
        else:
            due.append((r.arrival_time, order, _ARRIVAL, r))
    heapq.heapify(due)
    # a turn's finish submits the next turn: a jump must stop there
    has_next_turn = {r.request_id for r in requests
                     if r.conversation_id is not None and r.turn + 1 in later_turns.get(r.conversation_id, {})}
    order = len(requests)
    busy: list[tuple[float, int, _Instance]] = []  # (instance clock, place, instance) of instances with work
    history = ConversationHistory()
    prompts: dict[str, tuple[WorkloadRequest, list[int]]] = {}
    handed_off: dict[str, dict] = {}  # request id -> what its prefill and transfer left for its record
    records: list[PoolRecord] = []
    recomputed = 0  # full-block prompt tokens decode instances computed

    def submit(instance: _Instance, now: float, r: WorkloadRequest, prompt: list[int], max_tokens: int) -> None:
        instance.clock.advance_to(now)  # an idle instance's device waited until now
        instance.engine.add_request(r.request_id, {"prompt_token_ids": prompt, "cache_salt": r.cache_salt},
                                    _params(max_tokens), arrival_time=r.arrival_time)
        if not instance.busy:
            instance.busy = True
            heapq.heappush(busy, (instance.clock(), instance.pool.offset + instance.index, instance))

    def hand_off(now: float, source: _Instance, r: WorkloadRequest, prompt: list[int], out) -> None:
        """The prefill finished at `now`: pick the decode instance and book the transfer of what it lacks."""
        target = back.route(now, prompt, r.cache_salt)
        missing = target.engine.missing_prompt_blocks(prompt, r.cache_salt)  # what the real connector pulls
        num_bytes = len(missing.keys) * block_bytes
        start, end = links.reserve(("prefill", source.index), ("decode", target.index), now,
                                   link.transfer_seconds(num_bytes, kv_shards))
        handed_off[r.request_id] = dict(
            prefill_instance=source.index, prefill_cached_tokens=out.num_cached_tokens,
            prefill_done=now - r.arrival_time, pulled_tokens=len(missing.keys) * bs // num_groups,
            transfer_bytes=num_bytes, transfer_wait_s=start - now, transfer_s=end - start,
            num_preemptions=out.metrics.num_preemptions)
        nonlocal order
        order += 1
        heapq.heappush(due, (end, order, _HANDOFF, (r, prompt, target, missing)))

    def finish(instance: _Instance, now: float, out) -> None:
        nonlocal recomputed
        r, prompt = prompts.pop(out.request_id)
        m = out.metrics
        extra = handed_off.pop(r.request_id, {})
        preemptions = m.num_preemptions + extra.pop("num_preemptions", 0)
        cached = out.num_cached_tokens  # at admission: device hits and host-tier restores, pulled blocks included
        if back is not None:  # what the decode instance had or pulled and still computed: evicted meanwhile
            recomputed += max((len(prompt) - 1) // bs * bs - cached, 0)
            cached = max(cached - extra["pulled_tokens"], 0)
        records.append(PoolRecord(r.request_id, m.arrival_time, m.ttft, m.e2e_latency, m.tpot, *_gaps(m.token_times),
                                  len(prompt), cached, preemptions, instance.index, **extra))
        if r.conversation_id is not None:
            history.record(r, prompt, out.outputs[0].token_ids)
            nxt = later_turns.get(r.conversation_id, {}).pop(r.turn + 1, None)
            if nxt is not None:
                nonlocal order
                order += 1
                heapq.heappush(due, (max(nxt.arrival_time, now), order, _ARRIVAL, nxt))

    while due or busy:
        if due and (not busy or due[0][0] <= busy[0][0]):
            now, _, kind, payload = heapq.heappop(due)
            if kind == _ARRIVAL:
                r = payload
                prompt = history.full_prompt(r)
                prompts[r.request_id] = (r, prompt)
                submit(front.route(now, prompt, r.cache_salt), now, r, prompt,
                       1 if back is not None else r.max_tokens)
            else:
                r, prompt, target, missing = payload
                target.engine.land_blocks(missing, [(key, None) for key in missing.keys])  # no data: simulated
                submit(target, now, r, prompt, r.max_tokens)
            continue
        _, _, instance = heapq.heappop(busy)
        engine = instance.engine
        num_steps = 0
        # a jump admits waiting requests at the cost model's full price: not while a pulled prompt waits (its blocks
        # are restored at admission)
        if (decode_fast_forward and instance.pool.role != "prefill" and not instance.skip_fast_forward
                and not (instance.pool is back and engine.load().num_waiting)):
            until = min(due[0][0] if due else math.inf, busy[0][0] if busy else math.inf)
            num_steps, finished = engine.fast_forward(until=until, stop_after=has_next_turn)
            if 0 < num_steps < _FAST_FORWARD_MIN_STEPS:
                instance.skip_fast_forward = _FAST_FORWARD_BACKOFF_STEPS
        if not num_steps:
            instance.skip_fast_forward = max(instance.skip_fast_forward - 1, 0)
            finished = engine.step()
            if not engine.stats.last_step_batch and not finished:
                raise RuntimeError(f"{instance.pool.role} instance {instance.index} scheduled nothing with "
                                   "requests in flight")
        now = instance.clock()
        events = engine.take_kv_events()
        if events:
            instance.pool.publish(now, instance.index, events)
        for out in finished:
            if instance.pool is back or back is None:
                finish(instance, now, out)
            else:
                hand_off(now, instance, *prompts[out.request_id], out)
        if engine.has_unfinished_requests():
            heapq.heappush(busy, (now, instance.pool.offset + instance.index, instance))
        else:
            instance.busy = False
    first = min((rec.arrival_time for rec in records), default=0.0)
    last = max((rec.arrival_time + rec.e2e_latency for rec in records), default=0.0)
    return PoolsResult(pools, records, last - first, time.perf_counter() - wall_start, recomputed)
