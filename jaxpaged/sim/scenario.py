"""A simulated deployment (model, precision, device, engine limits) and request-rate sweeps.

`Deployment` says how a model is served: weight and KV precision, which device
profile, how much memory the KV cache gets. `run_at_rate` serves a workload at
one Poisson arrival rate; `sweep` runs several rates and `sustainable_rate`
picks the highest rate whose p99 time-to-first-token stays under a bound.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxpaged.cache.kv_groups import kv_cache_layout
from jaxpaged.config import DEFAULT_BLOCK_SIZE, ModelConfig, load_config
from jaxpaged.engine import EngineConfig
from jaxpaged.engine.config import MAX_NUM_BLOCKS
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.driver import SimResult, make_sim_engine, simulate
from jaxpaged.sim.profiles import DeviceProfile, get_profile
from jaxpaged.sim.workloads import WorkloadRequest, assign_arrivals


@dataclasses.dataclass(frozen=True)
class Deployment:
    """How one model is served (all that a simulated run depends on besides the workload).

    With `tensor_parallel_size` N the model is split over N devices of the profile:
    each holds 1/N of the weights and its KV heads' share of every block, and
    `kv_cache_bytes` / `memory_utilization` are per device.
    """

    model: str = "llama3-70b"
    profile: str = "a100-80gb"
    weight_bytes_per_param: float = 2.0  # 2 = bf16/fp16, 1 = fp8/int8, 0.5 = 4-bit
    kv_bytes_per_element: float = 2.0
    kv_cache_bytes: int | None = None  # None: memory_utilization * device memory - weights
    memory_utilization: float = 0.9  # vLLM's gpu_memory_utilization default
    block_size: int = DEFAULT_BLOCK_SIZE
    enable_prefix_caching: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    hash_algo: str = "xxh3_128"
    tensor_parallel_size: int = 1
    eviction_policy: str = "lru"
    kv_cache_metrics_sample: float = 0.0

    @property
    def model_config(self) -> ModelConfig:
        return load_config(self.model)

    @property
    def device(self) -> DeviceProfile:
        return get_profile(self.profile)

    def weight_bytes(self) -> float:
        """Bytes of every parameter at the deployment's weight precision."""
        return self.model_config.num_params() * self.weight_bytes_per_param

    def weight_bytes_per_device(self) -> float:
        """One device's share of the weights (all of them on one device)."""
        return self.weight_bytes() / self.tensor_parallel_size

    def block_bytes(self) -> float:
        """Bytes of one KV block (K and V of every pool tensor: all layers, or one KV cache group's)."""
        c = self.model_config
        tensors = kv_cache_layout(c.layer_windows).num_tensors
        return 2 * tensors * c.num_kv_heads * c.head_dim * self.kv_bytes_per_element * self.block_size

    def block_bytes_per_device(self) -> float:
        """One device's share of a block: its KV heads' slice (1/min(N, KV heads))."""
        return self.block_bytes() / self.model_config.kv_shards(self.tensor_parallel_size)

    def num_blocks(self) -> int:
        """KV blocks that fit the cache budget; raises if the weights leave no room."""
        self.model_config.check_tensor_parallel(self.tensor_parallel_size)
        budget = self.kv_cache_bytes
        if budget is None:
            budget = self.memory_utilization * self.device.memory_bytes - self.weight_bytes_per_device()
        blocks = int(budget // self.block_bytes_per_device())
        if blocks <= 0 and self.kv_cache_bytes is not None:
            raise ValueError(f"kv_cache_bytes={self.kv_cache_bytes} holds no KV block of {self.model} "
                             f"({self.block_bytes_per_device():.0f} bytes per block per device); "
                             f"give at least one block's worth")
        if blocks <= 0:
            where = (self.profile if self.tensor_parallel_size == 1
                     else f"{self.tensor_parallel_size} x {self.profile}")
            raise ValueError(f"{self.model} weights ({self.weight_bytes_per_device() / 1e9:.1f} GB per device) "
                             f"leave no room for a KV cache on {where}; quantize the weights, split them over "
                             f"more devices (tensor_parallel_size) or set kv_cache_bytes")
        if blocks > MAX_NUM_BLOCKS:
            raise ValueError(f"the KV cache budget ({budget / 1e9:.1f} GB) holds {blocks} blocks of {self.model}; "
                             f"at most {MAX_NUM_BLOCKS} (EngineConfig's num_blocks limit): set a smaller "
                             f"kv_cache_bytes")
        return blocks

    def cost_model(self) -> CostModel:
        """The roofline cost model for this model, precision and device."""
        return CostModel(self.model_config, self.device, weight_bytes_per_param=self.weight_bytes_per_param,
                         kv_bytes_per_element=self.kv_bytes_per_element, block_size=self.block_size,
                         tensor_parallel_size=self.tensor_parallel_size)

    def engine_config(self) -> EngineConfig:
        """The engine settings the simulated engine runs with."""
        return EngineConfig(model=self.model, block_size=self.block_size, num_blocks=self.num_blocks(),
                            enable_prefix_caching=self.enable_prefix_caching, max_num_seqs=self.max_num_seqs,
                            max_num_batched_tokens=self.max_num_batched_tokens, hash_algo=self.hash_algo,
                            eviction_policy=self.eviction_policy,
                            kv_cache_metrics_sample=self.kv_cache_metrics_sample)


def run_at_rate(deployment: Deployment, requests: list[WorkloadRequest], rate: float, seed: int = 0, *,
                decode_fast_forward: bool = True) -> SimResult:
    """Serve `requests` with Poisson arrivals at `rate` requests/s (<= 0: all at once) in simulated time."""
    requests = assign_arrivals([dataclasses.replace(r) for r in requests], rate, seed)
    return run_with_arrivals(deployment, requests, decode_fast_forward=decode_fast_forward)


def run_with_arrivals(deployment: Deployment, requests: list[WorkloadRequest], *,
                      decode_fast_forward: bool = True) -> SimResult:
    """Serve `requests` at their own `arrival_time`s (a trace's timestamps) in simulated time."""
    engine, clock = make_sim_engine(deployment.engine_config(), deployment.model_config, deployment.cost_model())
    return simulate(engine, clock, requests, decode_fast_forward=decode_fast_forward)


@dataclasses.dataclass(frozen=True)
class TracePoint:
    """One simulated trace replay: latency, goodput, hit rate and KV residency (simulated seconds)."""

    eviction_policy: str
    throughput_rps: float
    goodput_rps: float  # finished requests per second that met both SLOs
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    prefix_hit_rate: float
    num_preemptions: int
    kv_residency: dict
    wall_s: float


def summarize_trace(policy: str, result: SimResult, *, ttft_slo_s: float, tpot_slo_s: float) -> TracePoint:
    """Percentiles and goodput of one trace run (a request counts when TTFT <= ttft_slo_s and TPOT <= tpot_slo_s)."""
    point = summarize(0.0, result)
    good = sum(1 for r in result.records if r.ttft <= ttft_slo_s and (r.tpot is None or r.tpot <= tpot_slo_s))
    goodput = good / result.duration_s if result.duration_s > 0 else 0.0
    return TracePoint(policy, point.throughput_rps, goodput, point.ttft_p50, point.ttft_p99, point.tpot_p50,
                      point.prefix_hit_rate, point.num_preemptions, result.kv_residency, result.wall_s)


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """Latency and throughput at one offered request rate (simulated seconds)."""

    rate: float
    throughput_rps: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    prefix_hit_rate: float
    num_preemptions: int
    wall_s: float


def summarize(rate: float, result: SimResult) -> SweepPoint:
    """Percentiles of one run's per-request records."""
    ttft = np.array([r.ttft for r in result.records])
    tpot = np.array([r.tpot for r in result.records if r.tpot is not None])
    return SweepPoint(rate, result.throughput_rps, float(np.percentile(ttft, 50)), float(np.percentile(ttft, 99)),
                      float(np.median(tpot)) if len(tpot) else float("nan"), result.prefix_hit_rate,
                      result.num_preemptions, result.wall_s)


def sweep(run: Callable[[float], SimResult], rates: Sequence[float]) -> list[SweepPoint]:
    """Run and summarise each rate, in order."""
    return [summarize(rate, run(rate)) for rate in rates]


def sustainable_rate(points: Sequence[SweepPoint], ttft_p99_bound_s: float) -> float | None:
    """The highest rate such that it and every lower swept rate keep p99 TTFT within the bound."""
    best = None
    for p in sorted(points, key=lambda p: p.rate):
        if p.ttft_p99 > ttft_p99_bound_s:
            break
        best = p.rate
    return best


def refine_sustainable_rate(run: Callable[[float], SimResult], lo: float, hi: float, ttft_p99_bound_s: float,
                            iterations: int = 4) -> tuple[float, list[SweepPoint]]:
    """Bisect between a passing rate `lo` and a failing rate `hi`; returns the best passing rate and the runs."""
    points = []
    for _ in range(iterations):
        mid = (lo + hi) / 2
        point = summarize(mid, run(mid))
        points.append(point)
        if point.ttft_p99 <= ttft_p99_bound_s:
            lo = mid
        else:
            hi = mid
    return lo, points
