"""``jaxpaged simulate routing``: routing policies over N simulated replicas, the load growing with N.

Each run serves one workload on N replicas (`jaxpaged.sim.cluster`) behind a
`jaxpaged.router` policy, with ``rate_per_replica x N`` Poisson arrivals and
``requests_per_replica x N`` requests, so every N sees the same load per
replica. Goodput counts the requests meeting both SLOs per simulated second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from jaxpaged.report import markdown_table
from jaxpaged.router import make_policy
from jaxpaged.sim.cluster import simulate_cluster
from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.workloads import assign_arrivals, make_workload

HEADER = ["workload", "replicas", "policy", "hit rate", "goodput (req/s)", "throughput (req/s)", "p50 TTFT (s)",
          "p99 TTFT (s)", "p50 TPOT (ms)", "max/mean requests per replica", "preemptions", "wall (s)"]


@dataclasses.dataclass(frozen=True)
class RoutingLoad:
    """The load per replica, the workload scales and the goodput SLOs."""

    requests_per_replica: int = 150
    rate_per_replica: float = 40.0
    scales: Mapping[str, int | float] = dataclasses.field(default_factory=dict)
    ttft_slo_s: float = 0.5
    tpot_slo_s: float = 0.05
    seed: int = 0


def routing_sweep(deployment: Deployment, workloads: Sequence[str], replicas: Sequence[int], policies: Sequence[str],
                  load: RoutingLoad) -> list[dict]:
    """Every workload x replica count x policy: one summary each (`ClusterResult.summary` plus the names)."""
    print(f"{deployment.model} on {deployment.profile}: {deployment.num_blocks()} KV blocks of "
          f"{deployment.block_size} tokens per replica")
    results = []
    for workload in workloads:
        for num_replicas in replicas:
            for policy in policies:
                requests = make_workload(workload, num_requests=load.requests_per_replica * num_replicas,
                                         seed=load.seed, **load.scales)
                assign_arrivals(requests, load.rate_per_replica * num_replicas, load.seed)
                result = simulate_cluster(deployment, num_replicas, make_policy(policy), requests)
                results.append({"workload": workload, "policy": policy,
                                **result.summary(load.ttft_slo_s, load.tpot_slo_s)})
                print(f"done: {workload}, {num_replicas} replicas, {policy}", flush=True)
    return results


def routing_table(results: Sequence[Mapping]) -> str:
    """One row per run."""
    rows = []
    for s in results:
        tpot = "-" if s["tpot_p50_s"] is None else f"{s['tpot_p50_s'] * 1e3:.1f}"
        rows.append([s["workload"], s["num_replicas"], s["policy"], f"{s['prefix_hit_rate']:.1%}",
                     f"{s['goodput_rps']:.1f}", f"{s['throughput_rps']:.1f}", f"{s['ttft_p50_s']:.3f}",
                     f"{s['ttft_p99_s']:.3f}", tpot, f"{s['load_imbalance']:.2f}", s["preemptions"],
                     f"{s['wall_s']:.1f}"])
    return markdown_table(HEADER, rows, align="lrlrrrrrrrrr")
