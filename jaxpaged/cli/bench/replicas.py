"""Prefix-aware vs round-robin vs least-loaded routing over engine replicas on Ray Serve.

    jaxpaged bench replicas --model=tiny --replicas=2,4 --num_prefixes=8 --prefix_len=512 \
        --suffix_len=128 --output_len=16 --num_requests=64 --request_rate=2 --md_out=out/bench_replicas.md

Shared-prefix requests at Poisson arrivals to ``jaxpaged serve --data_parallel_size=N`` for each N, every
policy in turn from empty caches: prefix hit rate, TTFT and throughput. docs/benchmarks/replicas.md.
"""

from __future__ import annotations

import dataclasses
import logging

from jaxpaged.bench.online.datasets import arrival_offsets
from jaxpaged.bench.online.datasets import prefix_repetition_requests
from jaxpaged.bench.online.replicas import POLICY_ORDER, markdown_table, run_replica_counts
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags


@dataclasses.dataclass(frozen=True)
class ReplicasOptions:
    """The clusters and policies compared, the shared-prefix requests, their arrivals, each replica's KV pool."""

    replicas: tuple[int, ...] = option((2, 4), "replica counts, one cluster each", at_least=1)
    policies: tuple[str, ...] = option(tuple(POLICY_ORDER), "routing policies to compare", choices=POLICY_ORDER)
    num_prefixes: int = option(8, "shared prefixes", at_least=1)
    prefix_len: int = option(512, "tokens per shared prefix", at_least=1)
    suffix_len: int = option(128, "tokens of each request's own suffix", at_least=1)
    output_len: int = option(16, "tokens generated per request (ignore_eos)", at_least=1)
    num_requests: int = option(64, "requests per policy run", at_least=1)
    warmup_requests: int = option(32, "untimed run per policy first on each cluster: the first N requests "
                                      "(compiles)", at_least=0)
    request_rate: float = option(2.0, "Poisson arrival rate (requests/s)", at_least=1)
    max_concurrency: int | None = option(None, "cap on requests in flight (default: none)", at_least=1)
    kv_budget_tokens: int = option(3072, "KV pool of each replica, in tokens", at_least=1)
    seed: int = option(0, "workload and arrival seed", at_least=0)


# every replica's engine: the model, its step's token budget, and the compile cache the replicas share
COMMAND = CommandFlags(ReplicasOptions, engine=["model", "max_num_batched_tokens", "compile_cache_dir"],
                       engine_defaults={"model": "tiny", "max_num_batched_tokens": 1024})
FLAGS = COMMAND.flags


def main(argv):
    """Run every replica count and policy; print and write the table."""
    del argv
    logging.getLogger("httpx").setLevel(logging.WARNING)
    o, engine = COMMAND.options(), COMMAND.engine.kwargs()
    requests = prefix_repetition_requests(o.num_requests, prefix_len=o.prefix_len, suffix_len=o.suffix_len,
                                          num_prefixes=o.num_prefixes, output_len=o.output_len, seed=o.seed)
    offsets = arrival_offsets(len(requests), o.request_rate, seed=o.seed)
    results = run_replica_counts(engine["model"], list(o.replicas), requests, offsets,
                                 kv_budget_tokens=o.kv_budget_tokens,
                                 max_num_batched_tokens=engine["max_num_batched_tokens"],
                                 max_model_len=o.prefix_len + o.suffix_len + o.output_len, policies=list(o.policies),
                                 max_concurrency=o.max_concurrency, compile_cache_dir=engine["compile_cache_dir"],
                                 num_warmup=o.warmup_requests)
    COMMAND.out.write({"results": {str(n): r for n, r in results.items()}},
                      markdown_table(results))
