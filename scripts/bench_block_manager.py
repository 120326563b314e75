"""Benchmarks the host-side KV cache manager (no JAX, no device).

Measures allocate / free / match throughput in blocks per second, the host
time to admit a prompt cold and fully cached, per hash algorithm, and each
eviction policy's cost per block evicted, released and hit. Prints a
Markdown table and writes JSON.

    .venv/bin/python scripts/bench_block_manager.py --json_out=out/bench_block_manager.json
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from jaxpaged.cli import flag_checks
from jaxpaged.cache.eviction import EVICTION_POLICIES
from jaxpaged.cache.hashing import HASH_ALGOS
from jaxpaged.bench.offline.block_manager import BenchConfig, markdown_table, run_benchmarks

_NUM_BLOCKS = flags.DEFINE_integer("num_blocks", 4096, "Physical blocks in the pool.")
_BLOCK_SIZE = flags.DEFINE_integer("block_size", 16, "Tokens per block.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 1024, "Prompt length in tokens.")
_REPEATS = flags.DEFINE_integer("repeats", 2000, "Timed calls per measurement (median reported).")
_HASH_ALGO = flags.DEFINE_list("hash_algo", ["sha256", "xxh3_128"], "Hash algorithms to compare.")
_POLICIES = flags.DEFINE_list("eviction_policy", list(EVICTION_POLICIES),
                              "Eviction policies whose per-block cost is measured.")
_JSON_OUT = flags.DEFINE_string("json_out", "out/bench_block_manager.json", "Where to write the JSON results.")

flag_checks.positive("num_blocks", "block_size", "prompt_len", "repeats")
flag_checks.list_of("hash_algo", choices=HASH_ALGOS)
flag_checks.list_of("eviction_policy", choices=EVICTION_POLICIES)


def main(argv: list[str]) -> None:
    del argv
    cfg = BenchConfig(
        num_blocks=_NUM_BLOCKS.value,
        block_size=_BLOCK_SIZE.value,
        prompt_len=_PROMPT_LEN.value,
        repeats=_REPEATS.value,
        hash_algos=tuple(_HASH_ALGO.value),
        eviction_policies=tuple(_POLICIES.value),
    )
    results = run_benchmarks(cfg)
    print(markdown_table(results))
    if _JSON_OUT.value:
        os.makedirs(os.path.dirname(_JSON_OUT.value) or ".", exist_ok=True)
        with open(_JSON_OUT.value, "w") as f:
            json.dump(results, f, indent=2)
        print(f"\nwrote {_JSON_OUT.value}")


if __name__ == "__main__":
    app.run(main)
