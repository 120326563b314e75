"""Hybrid KV cache manager vs all-full layers on CPU: peak KV held and throughput, side by side in one run.

    jaxpaged bench hybrid-kv --num_prompts=8 --prompt_len=2048 --window=128

A tiny Gemma-3-like model (6 layers: 5 sliding of window W, 1 full; Llama math)
serves the same prompts twice with the same weights: once with its windows (the
hybrid manager, KV cache groups), once with every layer full attention (the
single-group manager). Reports peak KV blocks and bytes held and tokens/s of a timed pass after a
warm-up pass of the same shapes (so compiles are not timed; the count is reported).
"""

from __future__ import annotations

import numpy as np

from jaxpaged.bench.offline.hybrid_kv import timed_pass, tiny_gemma_like, warm_engine
from jaxpaged.bench.output import markdown_table
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.kv.pool import pool_bytes

FLAGS = FlagSet()
NUM_PROMPTS = FLAGS.DEFINE_integer("num_prompts", 8, "prompts served per layout")
PROMPT_LEN = FLAGS.DEFINE_integer("prompt_len", 2048, "tokens per prompt")
MAX_TOKENS = FLAGS.DEFINE_integer("max_tokens", 32, "tokens generated per prompt")
WINDOW = FLAGS.DEFINE_integer("window", 128, "sliding window of the local layers")
BLOCK_SIZE = EngineFlags(FLAGS, ["block_size"]).holders["block_size"]
REPEATS = FLAGS.DEFINE_integer("repeats", 5, "timed passes per layout, alternating")
OUT = OutputFlags(FLAGS)
FLAGS.positive("num_prompts", "prompt_len", "max_tokens", "window", "repeats")


def main(argv):
    """Run both layouts on the same prompts and print a Markdown table."""
    del argv
    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(0, 250, PROMPT_LEN.value))) for _ in range(NUM_PROMPTS.value)]
    layouts = {"hybrid": tiny_gemma_like(WINDOW.value), "all-full": tiny_gemma_like(None)}
    engines = {name: warm_engine(c, prompts, MAX_TOKENS.value, BLOCK_SIZE.value) for name, c in layouts.items()}
    passes = {name: [] for name in layouts}
    for _ in range(REPEATS.value):  # alternating rounds: both layouts see the same machine state
        for name, engine in engines.items():
            passes[name].append(timed_pass(engine, prompts, MAX_TOKENS.value))
    tokens = len(prompts) * (PROMPT_LEN.value + MAX_TOKENS.value)
    results = {}
    for name, runs in passes.items():
        block_bytes = pool_bytes(layouts[name], 1, BLOCK_SIZE.value, layouts[name].dtype)
        peak = max(r["peak_blocks"] for r in runs)
        seconds = float(np.median([r["seconds"] for r in runs]))
        results[name] = {"peak_blocks": peak, "block_bytes": block_bytes, "peak_kv_bytes": peak * block_bytes,
                         "num_blocks": engines[name].num_blocks, "median_seconds": seconds,
                         "seconds": [r["seconds"] for r in runs], "tokens_per_s": tokens / seconds,
                         "compiles_in_run": sum(r["compiles"] for r in runs)}
    ratios = [h["seconds"] / f["seconds"] for h, f in zip(passes["hybrid"], passes["all-full"])]
    table = markdown_table(
        ["layout", "peak KV blocks", "block bytes", "peak KV MB", "tokens/s (prompt+output)", "compiles in run"],
        [[name, r["peak_blocks"], f"{r['block_bytes']:,}", f"{r['peak_kv_bytes'] / 1e6:.2f}",
          f"{r['tokens_per_s']:.0f}",
          r["compiles_in_run"]] for name, r in results.items()])
    OUT.write(results, table)
    h, f = results["hybrid"], results["all-full"]
    print(f"hybrid / all-full: peak KV bytes {h['peak_kv_bytes'] / f['peak_kv_bytes']:.3f}, "
          f"throughput {h['tokens_per_s'] / f['tokens_per_s']:.2f}x (median of per-round ratios: "
          f"{1 / float(np.median(ratios)):.2f}x over {REPEATS.value} rounds)")
