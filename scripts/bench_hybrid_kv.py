"""Hybrid KV cache manager vs all-full layers on CPU: peak KV held and throughput, side by side in one run.

    python scripts/bench_hybrid_kv.py --num_prompts=8 --prompt_len=2048 --window=128

A tiny Gemma-3-like model (6 layers: 5 sliding of window W, 1 full; Llama math)
serves the same prompts twice with the same weights: once with its windows (the
hybrid manager, KV cache groups), once with every layer full attention (the
single-group manager). Reports peak KV blocks and bytes held and tokens/s of a timed pass after a
warm-up pass of the same shapes (so compiles are not timed; the count is reported).
"""

from __future__ import annotations

import json
import time

import numpy as np
from absl import app, flags

from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.kv.pool import pool_bytes
from jaxpaged.model import init_model
from jaxpaged.sampling_params import SamplingParams

NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 8, "prompts served per layout")
PROMPT_LEN = flags.DEFINE_integer("prompt_len", 2048, "tokens per prompt")
MAX_TOKENS = flags.DEFINE_integer("max_tokens", 32, "tokens generated per prompt")
WINDOW = flags.DEFINE_integer("window", 128, "sliding window of the local layers")
BLOCK_SIZE = flags.DEFINE_integer("block_size", 16, "tokens per block")
JSON_OUT = flags.DEFINE_string("json_out", None, "also write the results here")


def tiny_gemma_like(window: int | None):
    """6 layers, every 6th full (Gemma 3's 5:1), on the tiny config's shapes; None: all full."""
    layer_types = tuple("full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(6))
    config = load_config("tiny").replace(num_layers=6, max_position_embeddings=8192)
    return config if window is None else config.replace(sliding_window=window, layer_types=layer_types)


def serve(config, prompts, max_tokens, block_size) -> dict:
    """Serve every prompt through one engine; peak blocks and bytes held (sampled every step), tokens/s."""
    model = init_model(config, seed=0)
    kv_bytes = 256 * 2**20
    engine = Engine(EngineConfig(model="tiny", kv_cache_bytes=kv_bytes, block_size=block_size,
                                 max_num_batched_tokens=512, enable_prefix_caching=False), model=model)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):  # a warm-up pass of the same shapes compiles every step shape
        engine.add_request(f"warm{i}", [(t + 1) % 250 for t in p], params)
    while engine.has_unfinished_requests():
        engine.step()
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    compiles_before = engine.runner.num_compiles
    peak, start = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, engine.kv.stats.num_used_blocks)
    seconds = time.perf_counter() - start
    block_bytes = pool_bytes(config, 1, block_size, config.dtype)
    tokens = len(prompts) * (len(prompts[0]) + max_tokens)
    return {"peak_blocks": peak, "block_bytes": block_bytes, "peak_kv_bytes": peak * block_bytes,
            "num_blocks": engine.num_blocks, "seconds": seconds,
            "compiles_in_run": engine.runner.num_compiles - compiles_before, "tokens_per_s": tokens / seconds,
            "output_tokens_per_s": len(prompts) * max_tokens / seconds}


def main(argv):
    """Run both layouts on the same prompts and print a Markdown table."""
    del argv
    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(0, 250, PROMPT_LEN.value))) for _ in range(NUM_PROMPTS.value)]
    results = {name: serve(tiny_gemma_like(window), prompts, MAX_TOKENS.value, BLOCK_SIZE.value)
               for name, window in (("hybrid", WINDOW.value), ("all-full", None))}
    print("| layout | peak KV blocks | block bytes | peak KV MB | tokens/s (prompt+output) | compiles in run |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['peak_blocks']} | {r['block_bytes']:,} | {r['peak_kv_bytes'] / 1e6:.2f} | "
              f"{r['tokens_per_s']:.0f} | {r['compiles_in_run']} |")
    h, f = results["hybrid"], results["all-full"]
    print(f"hybrid / all-full: peak KV bytes {h['peak_kv_bytes'] / f['peak_kv_bytes']:.3f}, "
          f"throughput {h['tokens_per_s'] / f['tokens_per_s']:.2f}x")
    if JSON_OUT.value:
        with open(JSON_OUT.value, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    app.run(main)
