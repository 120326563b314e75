"""Prefix-aware vs round-robin vs least-loaded routing over engine replicas on Ray Serve.

    jaxpaged bench replicas --model=tiny --replicas=2,4 --num_prefixes=8 --prefix_len=512 \
        --suffix_len=128 --output_len=16 --num_requests=64 --request_rate=2 --md_out=out/bench_replicas.md

Shared-prefix requests at Poisson arrivals to ``jaxpaged serve --data_parallel_size=N`` for each N, every
policy in turn from empty caches: prefix hit rate, TTFT and throughput. docs/benchmarks/replicas.md.
"""

from __future__ import annotations

import logging

from jaxpaged.bench.online.replicas import ReplicasOptions, markdown_table, run_replica_counts
from jaxpaged.cli.options import CommandFlags

# every replica's engine: the model, its step's token budget, and the compile cache the replicas share
COMMAND = CommandFlags(ReplicasOptions, engine=["model", "max_num_batched_tokens", "compile_cache_dir"],
                       engine_defaults={"model": "tiny", "max_num_batched_tokens": 1024})
FLAGS = COMMAND.flags


def main(argv):
    """Run every replica count and policy; print and write the table."""
    del argv
    logging.getLogger("httpx").setLevel(logging.WARNING)
    engine = COMMAND.engine.kwargs()
    results = run_replica_counts(COMMAND.options(), engine["model"], compile_cache_dir=engine["compile_cache_dir"],
                                 max_num_batched_tokens=engine["max_num_batched_tokens"])
    COMMAND.out.write({"results": {str(n): r for n, r in results.items()}}, markdown_table(results))
