"""Benchmarks the host-side KV cache manager (no JAX, no device).

Measures allocate / free / match throughput in blocks per second, the host
time to admit a prompt cold and fully cached, per hash algorithm, and each
eviction policy's cost per block evicted, released and hit. Prints a
Markdown table and writes JSON.

    jaxpaged bench block-manager --json_out=out/bench_block_manager.json
"""

from __future__ import annotations


from jaxpaged.bench.offline.block_manager import BenchConfig, markdown_table, run_benchmarks
from jaxpaged.cache.eviction import EVICTION_POLICIES
from jaxpaged.cache.hashing import HASH_ALGOS
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
ENGINE = EngineFlags(FLAGS, ["num_blocks", "block_size"], defaults={"num_blocks": 4096})
_NUM_BLOCKS, _BLOCK_SIZE = ENGINE.holders["num_blocks"], ENGINE.holders["block_size"]
_PROMPT_LEN = FLAGS.DEFINE_integer("prompt_len", 1024, "Prompt length in tokens.")
_REPEATS = FLAGS.DEFINE_integer("repeats", 2000, "Timed calls per measurement (median reported).")
_HASH_ALGO = FLAGS.DEFINE_list("hash_algo", ["sha256", "xxh3_128"], "Hash algorithms to compare.")
_POLICIES = FLAGS.DEFINE_list("eviction_policy", list(EVICTION_POLICIES),
                              "Eviction policies whose per-block cost is measured.")
OUT = OutputFlags(FLAGS, json_out="out/bench_block_manager.json")

FLAGS.positive("prompt_len", "repeats")
FLAGS.list_of("hash_algo", choices=HASH_ALGOS)
FLAGS.list_of("eviction_policy", choices=EVICTION_POLICIES)


def main(argv: list[str]) -> None:
    """Run the cache-manager benchmarks; print and write the tables."""
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
    OUT.write(results, markdown_table(results))
