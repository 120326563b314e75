"""Hybrid KV cache manager vs all-full layers on CPU: peak KV held and throughput, side by side in one run.

    jaxpaged bench hybrid-kv --num_prompts=8 --prompt_len=2048 --window=128

A tiny Gemma-3-like model (6 layers: 5 sliding of window W, 1 full; Llama math)
serves the same prompts twice with the same weights: once with its windows (the
hybrid manager, KV cache groups), once with every layer full attention (the
single-group manager). Reports peak KV blocks and bytes held and tokens/s of a timed pass after a
warm-up pass of the same shapes (so compiles are not timed; the count is reported).
"""

from __future__ import annotations

from jaxpaged import compile_cache
from jaxpaged.bench.offline.hybrid_kv import compare_layouts, layouts_table, summary_line
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags

FLAGS = FlagSet()
NUM_PROMPTS = FLAGS.DEFINE_integer("num_prompts", 8, "prompts served per layout")
PROMPT_LEN = FLAGS.DEFINE_integer("prompt_len", 2048, "tokens per prompt")
MAX_TOKENS = FLAGS.DEFINE_integer("max_tokens", 32, "tokens generated per prompt")
WINDOW = FLAGS.DEFINE_integer("window", 128, "sliding window of the local layers")
ENGINE = EngineFlags(FLAGS, ["block_size", "compile_cache_dir"])
BLOCK_SIZE, COMPILE_CACHE = ENGINE.holders["block_size"], ENGINE.holders["compile_cache_dir"]
REPEATS = FLAGS.DEFINE_integer("repeats", 5, "timed passes per layout, alternating")
OUT = OutputFlags(FLAGS)
FLAGS.positive("num_prompts", "prompt_len", "max_tokens", "window", "repeats")


def main(argv):
    """Run both layouts on the same prompts and print a Markdown table."""
    del argv
    compile_cache.configure(COMPILE_CACHE.value)  # '' = off: the engines' "auto" keeps it off
    results, ratios = compare_layouts(NUM_PROMPTS.value, PROMPT_LEN.value, MAX_TOKENS.value, WINDOW.value,
                                      BLOCK_SIZE.value, REPEATS.value)
    OUT.write(results, layouts_table(results))
    print(summary_line(results, ratios))
