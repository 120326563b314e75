"""Host-side KV cache manager (no JAX, no device): allocate / free / match blocks per second, admitting a
prompt cold and fully cached per hash algorithm, and each eviction policy's cost per block.

    jaxpaged bench block-manager --json_out=out/bench_block_manager.json

See docs/benchmarks/block-manager.md.
"""

from __future__ import annotations

from jaxpaged.bench.offline.block_manager import BenchConfig, markdown_table, run_benchmarks
from jaxpaged.cli.options import CommandFlags

COMMAND = CommandFlags(BenchConfig, engine=["num_blocks", "block_size"], engine_defaults={"num_blocks": 4096},
                       json_out="out/bench_block_manager.json")
FLAGS = COMMAND.flags


def main(argv: list[str]) -> None:
    """Run the cache-manager benchmarks; print and write the tables."""
    del argv
    results = run_benchmarks(COMMAND.options(**COMMAND.engine.kwargs()))
    COMMAND.out.write(results, markdown_table(results))
