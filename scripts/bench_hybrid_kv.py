"""Hybrid KV cache manager vs all-full layers on CPU: peak KV held and throughput, side by side in one run.

    python scripts/bench_hybrid_kv.py --num_prompts=8 --prompt_len=2048 --window=128

A tiny Gemma-3-like model (6 layers: 5 sliding of window W, 1 full; Llama math)
serves the same prompts twice with the same weights: once with its windows (the
hybrid manager, KV cache groups), once with every layer full attention (the
single-group manager). Reports peak KV blocks and bytes held and tokens/s of a timed pass after a
warm-up pass of the same shapes (so compiles are not timed; the count is reported).
"""

from __future__ import annotations

import itertools
import json
import time

import numpy as np
from absl import app, flags

from jaxpaged.bench import flag_checks
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
REPEATS = flags.DEFINE_integer("repeats", 5, "timed passes per layout, alternating")
JSON_OUT = flags.DEFINE_string("json_out", None, "also write the results here")
flag_checks.positive("num_prompts", "prompt_len", "max_tokens", "window", "block_size", "repeats")


_REQUEST_IDS = itertools.count()


def tiny_gemma_like(window: int | None):
    """6 layers, every 6th full (Gemma 3's 5:1), on the tiny config's shapes; None: all full."""
    layer_types = tuple("full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(6))
    config = load_config("tiny").replace(num_layers=6, max_position_embeddings=8192)
    return config if window is None else config.replace(sliding_window=window, layer_types=layer_types)


def warm_engine(config, prompts, max_tokens, block_size) -> Engine:
    """An engine for `config` that has served a pass of the same shapes (every step shape compiled)."""
    engine = Engine(EngineConfig(model="tiny", kv_cache_bytes=256 * 2**20, block_size=block_size,
                                 max_num_batched_tokens=512, enable_prefix_caching=False),
                    model=init_model(config, seed=0))
    timed_pass(engine, [[(t + 1) % 250 for t in p] for p in prompts], max_tokens)
    return engine


def timed_pass(engine: Engine, prompts, max_tokens) -> dict:
    """Serve every prompt; peak blocks held (sampled every step), seconds and compiles of the pass."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for p in prompts:
        engine.add_request(f"r{next(_REQUEST_IDS)}", p, params)
    compiles_before = engine.num_compiles
    peak, start = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, engine.kv_stats().num_used_blocks)
    return {"peak_blocks": peak, "seconds": time.perf_counter() - start,
            "compiles": engine.num_compiles - compiles_before}


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
    print("| layout | peak KV blocks | block bytes | peak KV MB | tokens/s (prompt+output) | compiles in run |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['peak_blocks']} | {r['block_bytes']:,} | {r['peak_kv_bytes'] / 1e6:.2f} | "
              f"{r['tokens_per_s']:.0f} | {r['compiles_in_run']} |")
    h, f = results["hybrid"], results["all-full"]
    print(f"hybrid / all-full: peak KV bytes {h['peak_kv_bytes'] / f['peak_kv_bytes']:.3f}, "
          f"throughput {h['tokens_per_s'] / f['tokens_per_s']:.2f}x (median of per-round ratios: "
          f"{1 / float(np.median(ratios)):.2f}x over {REPEATS.value} rounds)")
    if JSON_OUT.value:
        with open(JSON_OUT.value, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    app.run(main)
