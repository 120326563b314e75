"""Prefix-aware routing at scale, simulated: hit rate and goodput against replica count and routing policy.

    jaxpaged simulate routing --model=llama3-8b --kv_cache_gb=4 --workloads=chatbot,multiturn \
        --replicas=8,16,64 --requests_per_replica=150 --rate_per_replica=40 --scales=output_len=64

N replicas get N times the requests and the rate, so every N sees the same load per replica; goodput counts
requests meeting both SLOs (`jaxpaged.sim.routing_sweep`). See docs/benchmarks/simulator.md.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.bench.options import option
from jaxpaged.cli.deployment_flags import DeploymentFlags
from jaxpaged.cli.flagset import parse_key_values
from jaxpaged.cli.options import CommandFlags
from jaxpaged.router import POLICIES
from jaxpaged.sim.routing_sweep import RoutingLoad, routing_sweep, routing_table
from jaxpaged.sim.workloads import WORKLOADS


@dataclasses.dataclass(frozen=True)
class RoutingOptions:
    """What is swept (workloads, replica counts, policies), the load per replica and the goodput objectives."""

    workloads: tuple[str, ...] = option(("chatbot", "multiturn"), "workloads (jaxpaged/sim/workloads.py)",
                                        choices=list(WORKLOADS))
    scales: tuple[str, ...] = option(("output_len=64",), "workload length overrides, key=value", check="key_values")
    replicas: tuple[int, ...] = option((8, 16, 64), "replica counts", at_least=1)
    policies: tuple[str, ...] = option(tuple(POLICIES), "routing policies", choices=list(POLICIES))
    requests_per_replica: int = option(150, "requests per run, per replica", at_least=1)
    rate_per_replica: float = option(40.0, "offered Poisson rate per replica (req/s)", at_least=1e-3)
    ttft_slo_s: float = option(0.5, "time-to-first-token objective of goodput (s)", at_least=1e-3)
    tpot_slo_s: float = option(0.05, "time-per-output-token objective of goodput (s)", at_least=1e-3)
    seed: int = option(0, "workload and arrival seed", at_least=0)


COMMAND = CommandFlags(RoutingOptions)
FLAGS = COMMAND.flags
DEPLOY = DeploymentFlags(FLAGS, ["model", "block_size", "max_num_seqs", "max_num_batched_tokens"], kv_cache_gb=4.0,
                         kv_cache_help="KV cache per replica in GB (1e9); small, so caches evict")


def main(argv):
    """Simulate every workload x replica count x policy; print and write the table."""
    del argv
    deployment, o = DEPLOY.deployment(), COMMAND.options()
    load = RoutingLoad(requests_per_replica=o.requests_per_replica, rate_per_replica=o.rate_per_replica,
                       scales=parse_key_values(list(o.scales)), ttft_slo_s=o.ttft_slo_s, tpot_slo_s=o.tpot_slo_s,
                       seed=o.seed)
    results = routing_sweep(deployment, list(o.workloads), list(o.replicas), list(o.policies), load)
    COMMAND.out.write({"deployment": dataclasses.asdict(deployment), "results": results}, routing_table(results))
