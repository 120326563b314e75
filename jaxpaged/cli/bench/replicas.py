"""Prefix-aware vs round-robin vs least-loaded routing over engine replicas on Ray Serve.

    jaxpaged bench replicas --model=tiny --replicas=2,4 --num_prefixes=8 --prefix_len=512 \
        --suffix_len=128 --output_len=16 --num_requests=64 --request_rate=2 \
        --json_out=out/bench_replicas.json --md_out=out/bench_replicas.md

A prefix-repetition workload (``--num_prefixes`` shared prefixes of
``--prefix_len`` tokens, each request one of them plus its own
``--suffix_len`` tokens) sent at Poisson arrivals to
``jaxpaged serve --data_parallel_size=N`` for each N of ``--replicas``; on
each cluster the three policies run one after another on the same requests,
each from empty caches (jaxpaged.bench.online.replicas). Reports the prefix hit
rate, TTFT p50/p99 and throughput per policy, side by side.
"""

from __future__ import annotations

import logging

from jaxpaged.bench.online.arrivals import arrival_offsets
from jaxpaged.bench.online.datasets import prefix_repetition_requests
from jaxpaged.bench.online.replicas import POLICY_ORDER, markdown_table, run_replica_counts
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
# every replica's engine: the model, its step's token budget, and the compile cache the replicas share
ENGINE = EngineFlags(FLAGS, ["model", "max_num_batched_tokens", "compile_cache_dir"],
                     defaults={"model": "tiny", "max_num_batched_tokens": 1024})
MODEL, MAX_BATCHED = ENGINE.holders["model"], ENGINE.holders["max_num_batched_tokens"]
COMPILE_CACHE = ENGINE.holders["compile_cache_dir"]
REPLICAS = FLAGS.DEFINE_list("replicas", ["2", "4"], "replica counts, one cluster each")
POLICIES = FLAGS.DEFINE_list("policies", list(POLICY_ORDER), "routing policies to compare")
NUM_PREFIXES = FLAGS.DEFINE_integer("num_prefixes", 8, "shared prefixes")
PREFIX_LEN = FLAGS.DEFINE_integer("prefix_len", 512, "tokens per shared prefix")
SUFFIX_LEN = FLAGS.DEFINE_integer("suffix_len", 128, "tokens of each request's own suffix")
OUTPUT_LEN = FLAGS.DEFINE_integer("output_len", 16, "tokens generated per request (ignore_eos)")
NUM_REQUESTS = FLAGS.DEFINE_integer("num_requests", 64, "requests per policy run")
WARMUP_REQUESTS = FLAGS.DEFINE_integer("warmup_requests", 32,
                                       "untimed run per policy first on each cluster: the first N requests (compiles)")
RATE = FLAGS.DEFINE_float("request_rate", 2.0, "Poisson arrival rate (requests/s)")
MAX_CONCURRENCY = FLAGS.DEFINE_integer("max_concurrency", None, "cap on requests in flight (default: none)")
KV_TOKENS = FLAGS.DEFINE_integer("kv_budget_tokens", 3072, "KV pool of each replica, in tokens")
SEED = FLAGS.DEFINE_integer("seed", 0, "workload and arrival seed")
OUT = OutputFlags(FLAGS)

FLAGS.positive("num_prefixes", "prefix_len", "suffix_len", "output_len", "num_requests", "request_rate",
                     "max_concurrency", "kv_budget_tokens")
FLAGS.non_negative("warmup_requests", "seed")
FLAGS.list_of("replicas", integer_at_least=1)
FLAGS.list_of("policies", choices=POLICY_ORDER)


def main(argv):
    """Run every replica count and policy; print and write the table."""
    del argv
    logging.getLogger("httpx").setLevel(logging.WARNING)
    requests = prefix_repetition_requests(NUM_REQUESTS.value, prefix_len=PREFIX_LEN.value, suffix_len=SUFFIX_LEN.value,
                                          num_prefixes=NUM_PREFIXES.value, output_len=OUTPUT_LEN.value,
                                          seed=SEED.value)
    offsets = arrival_offsets(len(requests), RATE.value, seed=SEED.value)
    results = run_replica_counts(MODEL.value, [int(n) for n in REPLICAS.value], requests, offsets,
                                 kv_budget_tokens=KV_TOKENS.value, max_num_batched_tokens=MAX_BATCHED.value,
                                 max_model_len=PREFIX_LEN.value + SUFFIX_LEN.value + OUTPUT_LEN.value,
                                 policies=POLICIES.value, max_concurrency=MAX_CONCURRENCY.value,
                                 compile_cache_dir=COMPILE_CACHE.value, num_warmup=WARMUP_REQUESTS.value)
    settings = FLAGS.values.flag_values_dict()
    OUT.write({"flags": settings, "results": {str(n): r for n, r in results.items()}}, markdown_table(results))
