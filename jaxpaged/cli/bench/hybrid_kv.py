"""Hybrid KV cache manager vs all-full layers on CPU: peak KV held and throughput, side by side in one run.

    jaxpaged bench hybrid-kv --num_prompts=8 --prompt_len=2048 --window=128

A tiny Gemma-3-like model (5 sliding layers of window W, 1 full) serves the same prompts with its windows and
with every layer full; timed passes follow a warm-up pass (`jaxpaged.bench.offline.hybrid_kv`). See
docs/benchmarks/hybrid-kv.md.
"""

from __future__ import annotations

import dataclasses

from jaxpaged import compile_cache
from jaxpaged.bench.offline.hybrid_kv import compare_layouts, layouts_table, summary_line
from jaxpaged.bench.options import option
from jaxpaged.cli.options import CommandFlags


@dataclasses.dataclass(frozen=True)
class HybridKVOptions:
    """The prompts served, the local layers' window, and the passes."""

    num_prompts: int = option(8, "prompts served per layout", at_least=1)
    prompt_len: int = option(2048, "tokens per prompt", at_least=1)
    max_tokens: int = option(32, "tokens generated per prompt", at_least=1)
    window: int = option(128, "sliding window of the local layers", at_least=1)
    repeats: int = option(5, "timed passes per layout, alternating", at_least=1)


COMMAND = CommandFlags(HybridKVOptions, engine=["block_size", "compile_cache_dir"])
FLAGS = COMMAND.flags


def main(argv):
    """Run both layouts on the same prompts and print a Markdown table."""
    del argv
    o, engine = COMMAND.options(), COMMAND.engine.kwargs()
    compile_cache.configure(engine["compile_cache_dir"])  # '' = off: the engines' "auto" keeps it off
    results, ratios = compare_layouts(o.num_prompts, o.prompt_len, o.max_tokens, o.window, engine["block_size"],
                                      o.repeats)
    COMMAND.out.write(results, layouts_table(results))
    print(summary_line(results, ratios))
