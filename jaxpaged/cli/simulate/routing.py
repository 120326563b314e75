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
requests meeting both `--ttft_slo_s` and `--tpot_slo_s`, per simulated second.
"""

from __future__ import annotations

import dataclasses


from jaxpaged.bench.output import markdown_table
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet, parse_key_values
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.router import POLICIES, make_policy
from jaxpaged.sim.cluster import simulate_cluster
from jaxpaged.sim.scenario import Deployment
from jaxpaged.workloads import WORKLOADS, assign_arrivals, make_workload

FLAGS = FlagSet()
MODEL = FLAGS.DEFINE_string("model", "llama3-8b", "model config name or path")
PROFILE = FLAGS.DEFINE_string("profile", "a100-80gb", "a100-80gb, h100-80gb, h200-141gb, cpu, or a profile JSON")
KV_CACHE_GB = FLAGS.DEFINE_float("kv_cache_gb", 4.0, "KV cache per replica in GB (1e9); small, so caches evict")
BLOCK_SIZE = EngineFlags(FLAGS, ["block_size"]).holders["block_size"]
MAX_SEQS = FLAGS.DEFINE_integer("max_num_seqs", 256, "most sequences per step")
MAX_TOKENS = FLAGS.DEFINE_integer("max_num_batched_tokens", 2048, "token budget per step (chunked prefill)")
WORKLOADS_FLAG = FLAGS.DEFINE_list("workloads", ["chatbot", "multiturn"], "workloads (jaxpaged/workloads.py)")
SCALES = FLAGS.DEFINE_list("scales", ["output_len=64"], "workload length overrides, key=value")
REPLICAS = FLAGS.DEFINE_list("replicas", ["8", "16", "64"], "replica counts")
POLICIES_FLAG = FLAGS.DEFINE_list("policies", list(POLICIES), "routing policies")
PER_REPLICA_REQUESTS = FLAGS.DEFINE_integer("requests_per_replica", 150, "requests per run, per replica")
PER_REPLICA_RATE = FLAGS.DEFINE_float("rate_per_replica", 40.0, "offered Poisson rate per replica (req/s)")
TTFT_SLO = FLAGS.DEFINE_float("ttft_slo_s", 0.5, "time-to-first-token objective of goodput (s)")
TPOT_SLO = FLAGS.DEFINE_float("tpot_slo_s", 0.05, "time-per-output-token objective of goodput (s)")
SEED = FLAGS.DEFINE_integer("seed", 0, "workload and arrival seed")
OUT = OutputFlags(FLAGS)

FLAGS.model_name("model")
FLAGS.device_profile("profile")
FLAGS.positive("max_num_seqs", "max_num_batched_tokens", "requests_per_replica")
FLAGS.non_negative("seed")
FLAGS.at_least(1e-6, "kv_cache_gb")
FLAGS.at_least(1e-3, "rate_per_replica", "ttft_slo_s", "tpot_slo_s")
FLAGS.list_of("workloads", choices=list(WORKLOADS))
FLAGS.list_of("policies", choices=list(POLICIES))
FLAGS.list_of("replicas", integer_at_least=1)
FLAGS.key_values("scales")

_HEADER = ["workload", "replicas", "policy", "hit rate", "goodput (req/s)", "throughput (req/s)", "p50 TTFT (s)",
           "p99 TTFT (s)", "p50 TPOT (ms)", "max/mean requests per replica", "preemptions", "wall (s)"]


def _row(workload: str, policy: str, s: dict) -> list:
    tpot = "-" if s["tpot_p50_s"] is None else f"{s['tpot_p50_s'] * 1e3:.1f}"
    return [workload, s["num_replicas"], policy, f"{s['prefix_hit_rate']:.1%}", f"{s['goodput_rps']:.1f}",
            f"{s['throughput_rps']:.1f}", f"{s['ttft_p50_s']:.3f}", f"{s['ttft_p99_s']:.3f}", tpot,
            f"{s['load_imbalance']:.2f}", s["preemptions"], f"{s['wall_s']:.1f}"]


def main(argv):
    """Simulate every workload x replica count x policy; print and write the table."""
    del argv
    deployment = Deployment(model=MODEL.value, profile=PROFILE.value, kv_cache_bytes=int(KV_CACHE_GB.value * 1e9),
                            block_size=BLOCK_SIZE.value, max_num_seqs=MAX_SEQS.value,
                            max_num_batched_tokens=MAX_TOKENS.value)
    print(f"{deployment.model} on {deployment.profile}: {deployment.num_blocks()} KV blocks of "
          f"{deployment.block_size} tokens per replica")
    rows, results = [], []
    for workload in WORKLOADS_FLAG.value:
        for num_replicas in [int(n) for n in REPLICAS.value]:
            for policy in POLICIES_FLAG.value:
                requests = make_workload(workload, num_requests=PER_REPLICA_REQUESTS.value * num_replicas,
                                         seed=SEED.value, **parse_key_values(SCALES.value))
                assign_arrivals(requests, PER_REPLICA_RATE.value * num_replicas, SEED.value)
                result = simulate_cluster(deployment, num_replicas, make_policy(policy), requests)
                summary = result.summary(TTFT_SLO.value, TPOT_SLO.value)
                rows.append(_row(workload, policy, summary))
                print(f"done: {workload}, {num_replicas} replicas, {policy}", flush=True)
                results.append({"workload": workload, "policy": policy, **summary})
    OUT.write({"deployment": dataclasses.asdict(deployment), "scales": parse_key_values(SCALES.value),
               "requests_per_replica": PER_REPLICA_REQUESTS.value, "rate_per_replica": PER_REPLICA_RATE.value,
               "ttft_slo_s": TTFT_SLO.value, "tpot_slo_s": TPOT_SLO.value, "seed": SEED.value, "results": results},
              markdown_table(_HEADER, rows, align="lrlrrrrrrrrr"))
