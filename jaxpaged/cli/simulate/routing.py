"""Prefix-aware routing at scale, simulated: hit rate and goodput vs replica count and routing policy.

    jaxpaged simulate routing --model=llama3-8b --profile=a100-80gb --kv_cache_gb=4 \
        --workloads=chatbot,multiturn --replicas=8,16,64 --policies=round_robin,least_loaded,prefix_aware \
        --requests_per_replica=150 --rate_per_replica=40 --scales=output_len=64 \
        --json_out=routing.json --md_out=routing.md

Each run serves one workload on N simulated replicas (engines over
`SimulatedRunner`, one simulated timeline; `jaxpaged.sim.cluster`) behind the
`jaxpaged.router` policy, fed by the replicas' KV events. The offered load
grows with N (`--rate_per_replica` x N Poisson arrivals, `--requests_per_replica`
x N requests), so every N sees the same load per replica. Goodput counts the
requests meeting both `--ttft_slo_s` and `--tpot_slo_s`, per simulated second
(`jaxpaged.sim.routing_sweep`).
"""

from __future__ import annotations

import dataclasses

from jaxpaged.cli.deployment_flags import DeploymentFlags
from jaxpaged.cli.flagset import FlagSet, parse_key_values
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.router import POLICIES
from jaxpaged.sim.routing_sweep import RoutingLoad, routing_sweep, routing_table
from jaxpaged.sim.workloads import WORKLOADS

FLAGS = FlagSet()
DEPLOY = DeploymentFlags(FLAGS, ["model", "block_size", "max_num_seqs", "max_num_batched_tokens"], kv_cache_gb=4.0,
                         kv_cache_help="KV cache per replica in GB (1e9); small, so caches evict",
                         kv_cache_gb_at_least=1e-6)
WORKLOADS_FLAG = FLAGS.DEFINE_list("workloads", ["chatbot", "multiturn"], "workloads (jaxpaged/sim/workloads.py)")
SCALES = FLAGS.DEFINE_list("scales", ["output_len=64"], "workload length overrides, key=value")
REPLICAS = FLAGS.DEFINE_list("replicas", ["8", "16", "64"], "replica counts")
POLICIES_FLAG = FLAGS.DEFINE_list("policies", list(POLICIES), "routing policies")
PER_REPLICA_REQUESTS = FLAGS.DEFINE_integer("requests_per_replica", 150, "requests per run, per replica")
PER_REPLICA_RATE = FLAGS.DEFINE_float("rate_per_replica", 40.0, "offered Poisson rate per replica (req/s)")
TTFT_SLO = FLAGS.DEFINE_float("ttft_slo_s", 0.5, "time-to-first-token objective of goodput (s)")
TPOT_SLO = FLAGS.DEFINE_float("tpot_slo_s", 0.05, "time-per-output-token objective of goodput (s)")
SEED = FLAGS.DEFINE_integer("seed", 0, "workload and arrival seed")
OUT = OutputFlags(FLAGS)

FLAGS.positive("requests_per_replica")
FLAGS.non_negative("seed")
FLAGS.at_least(1e-3, "rate_per_replica", "ttft_slo_s", "tpot_slo_s")
FLAGS.list_of("workloads", choices=list(WORKLOADS))
FLAGS.list_of("policies", choices=list(POLICIES))
FLAGS.list_of("replicas", integer_at_least=1)
FLAGS.key_values("scales")

def main(argv):
    """Simulate every workload x replica count x policy; print and write the table."""
    del argv
    deployment = DEPLOY.deployment()
    load = RoutingLoad(requests_per_replica=PER_REPLICA_REQUESTS.value, rate_per_replica=PER_REPLICA_RATE.value,
                       scales=parse_key_values(SCALES.value), ttft_slo_s=TTFT_SLO.value, tpot_slo_s=TPOT_SLO.value,
                       seed=SEED.value)
    results = routing_sweep(deployment, WORKLOADS_FLAG.value, [int(n) for n in REPLICAS.value], POLICIES_FLAG.value,
                            load)
    OUT.write({"deployment": dataclasses.asdict(deployment), "scales": load.scales,
               "requests_per_replica": load.requests_per_replica, "rate_per_replica": load.rate_per_replica,
               "ttft_slo_s": load.ttft_slo_s, "tpot_slo_s": load.tpot_slo_s, "seed": load.seed, "results": results},
              routing_table(results))
