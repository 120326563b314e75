"""Prefix-aware vs round-robin vs least-loaded routing over engine replicas on Ray Serve.

    python scripts/bench_replicas.py --model=tiny --replicas=2,4 --num_prefixes=8 --prefix_len=512 \
        --suffix_len=128 --output_len=16 --num_requests=64 --request_rate=2 \
        --json_out=out/bench_replicas.json --md_out=out/bench_replicas.md

A prefix-repetition workload (``--num_prefixes`` shared prefixes of
``--prefix_len`` tokens, each request one of them plus its own
``--suffix_len`` tokens) sent at Poisson arrivals to
``scripts/serve.py --data_parallel_size=N`` for each N of ``--replicas``; on
each cluster the three policies run one after another on the same requests,
each from empty caches (jaxpaged.bench.online.replicas). Reports the prefix hit
rate, TTFT p50/p99 and throughput per policy, side by side.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from absl import app, flags

from jaxpaged.cli import flag_checks
from jaxpaged.bench.online.arrivals import arrival_offsets
from jaxpaged.bench.online.datasets import prefix_repetition_requests
from jaxpaged.bench.online.replicas import POLICY_ORDER, markdown_table, run_policies

MODEL = flags.DEFINE_string("model", "tiny", "model for every replica (a shipped config name or a directory)")
REPLICAS = flags.DEFINE_list("replicas", ["2", "4"], "replica counts, one cluster each")
POLICIES = flags.DEFINE_list("policies", list(POLICY_ORDER), "routing policies to compare")
NUM_PREFIXES = flags.DEFINE_integer("num_prefixes", 8, "shared prefixes")
PREFIX_LEN = flags.DEFINE_integer("prefix_len", 512, "tokens per shared prefix")
SUFFIX_LEN = flags.DEFINE_integer("suffix_len", 128, "tokens of each request's own suffix")
OUTPUT_LEN = flags.DEFINE_integer("output_len", 16, "tokens generated per request (ignore_eos)")
NUM_REQUESTS = flags.DEFINE_integer("num_requests", 64, "requests per policy run")
WARMUP_REQUESTS = flags.DEFINE_integer("warmup_requests", 32,
                                       "untimed run per policy first on each cluster: the first N requests (compiles)")
COMPILE_CACHE = flags.DEFINE_string("compile_cache_dir", "/tmp/jaxpaged-bench-replicas-compile",
                                    "JAX persistent compile cache shared by the replicas (empty: none)")
RATE = flags.DEFINE_float("request_rate", 2.0, "Poisson arrival rate (requests/s)")
MAX_CONCURRENCY = flags.DEFINE_integer("max_concurrency", None, "cap on requests in flight (default: none)")
KV_TOKENS = flags.DEFINE_integer("kv_budget_tokens", 3072, "KV pool of each replica, in tokens")
MAX_BATCHED = flags.DEFINE_integer("max_num_batched_tokens", 1024, "token budget of one step")
SEED = flags.DEFINE_integer("seed", 0, "workload and arrival seed")
JSON_OUT = flags.DEFINE_string("json_out", None, "write all results here as JSON")
MD_OUT = flags.DEFINE_string("md_out", None, "write the Markdown table here")

flag_checks.positive("num_prefixes", "prefix_len", "suffix_len", "output_len", "num_requests", "request_rate",
                     "max_concurrency", "kv_budget_tokens", "max_num_batched_tokens")
flag_checks.non_negative("warmup_requests", "seed")
flag_checks.list_of("replicas", integer_at_least=1)
flag_checks.list_of("policies", choices=POLICY_ORDER)
flag_checks.model_name()

# Each replica's XLA runs single-threaded: the replicas, not one replica's threads, share the cores.
REPLICA_ENV = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false", "RAY_USAGE_STATS_ENABLED": "0"}


def main(argv):
    """Run every replica count and policy; print and write the table."""
    del argv
    logging.getLogger("httpx").setLevel(logging.WARNING)
    requests = prefix_repetition_requests(NUM_REQUESTS.value, prefix_len=PREFIX_LEN.value, suffix_len=SUFFIX_LEN.value,
                                          num_prefixes=NUM_PREFIXES.value, output_len=OUTPUT_LEN.value,
                                          seed=SEED.value)
    offsets = arrival_offsets(len(requests), RATE.value, seed=SEED.value)
    max_len = PREFIX_LEN.value + SUFFIX_LEN.value + OUTPUT_LEN.value
    env = {**REPLICA_ENV, "XLA_FLAGS": " ".join(filter(None, [os.environ.get("XLA_FLAGS"), REPLICA_ENV["XLA_FLAGS"]]))}
    if COMPILE_CACHE.value:
        env |= {"JAX_COMPILATION_CACHE_DIR": COMPILE_CACHE.value, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    results = {}
    for n in map(int, REPLICAS.value):
        serve_args = [f"--model={MODEL.value}", f"--data_parallel_size={n}", f"--kv_budget_tokens={KV_TOKENS.value}",
                      f"--max_model_len={max_len}", f"--max_num_batched_tokens={MAX_BATCHED.value}",
                      "--max_num_seqs=64"]
        results[n] = run_policies(serve_args, requests, offsets, policies=POLICIES.value,
                                  max_concurrency=MAX_CONCURRENCY.value, env=env,
                                  num_warmup=min(WARMUP_REQUESTS.value, len(requests)))
    table = markdown_table(results)
    print(table)
    if JSON_OUT.value:
        Path(JSON_OUT.value).parent.mkdir(parents=True, exist_ok=True)
        settings = {f.name: f.value for f in flags.FLAGS.get_key_flags_for_module(__name__)}
        Path(JSON_OUT.value).write_text(json.dumps({"flags": settings,
                                                    "results": {str(n): r for n, r in results.items()}}, indent=2))
    if MD_OUT.value:
        Path(MD_OUT.value).parent.mkdir(parents=True, exist_ok=True)
        Path(MD_OUT.value).write_text(table)


if __name__ == "__main__":
    app.run(main)
