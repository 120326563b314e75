"""The hybrid KV cache manager against every layer full, on a tiny Gemma-3-like model (`jaxpaged bench hybrid-kv`).

The same prompts and weights served twice: with the model's sliding windows
(KV cache groups) and with every layer full attention; each engine warmed up on
a pass of the same shapes first, so the timed passes compile nothing.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from jaxpaged.bench.offline.timing import alternate
from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.kv_pool.pool import pool_bytes
from jaxpaged.model import init_model
from jaxpaged.report import markdown_table
from jaxpaged.sampling_params import SamplingParams

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


def compare_layouts(num_prompts: int, prompt_len: int, max_tokens: int, window: int, block_size: int,
                    repeats: int) -> tuple[dict[str, dict], list[float]]:
    """Both layouts on the same random prompts, ``repeats`` alternating rounds: per layout its peak KV (blocks
    and bytes), median pass time, tokens/s and compiles; and each round's hybrid / all-full time ratio."""
    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(0, 250, prompt_len))) for _ in range(num_prompts)]
    layouts = {"hybrid": tiny_gemma_like(window), "all-full": tiny_gemma_like(None)}
    engines = {name: warm_engine(c, prompts, max_tokens, block_size) for name, c in layouts.items()}
    passes = alternate({name: lambda e=engine: timed_pass(e, prompts, max_tokens) for name, engine in engines.items()},
                       repeats)
    tokens = num_prompts * (prompt_len + max_tokens)
    results = {}
    for name, runs in passes.items():
        block_bytes = pool_bytes(layouts[name], 1, block_size, layouts[name].dtype)
        peak = max(r["peak_blocks"] for r in runs)
        seconds = float(np.median([r["seconds"] for r in runs]))
        results[name] = {"peak_blocks": peak, "block_bytes": block_bytes, "peak_kv_bytes": peak * block_bytes,
                         "num_blocks": engines[name].num_blocks, "median_seconds": seconds,
                         "seconds": [r["seconds"] for r in runs], "tokens_per_s": tokens / seconds,
                         "compiles_in_run": sum(r["compiles"] for r in runs)}
    ratios = [h["seconds"] / f["seconds"] for h, f in zip(passes["hybrid"], passes["all-full"])]
    return results, ratios


def layouts_table(results: dict[str, dict]) -> str:
    """One row per layout: peak KV, block bytes, throughput, compiles."""
    return markdown_table(
        ["layout", "peak KV blocks", "block bytes", "peak KV MB", "tokens/s (prompt+output)", "compiles in run"],
        [[name, r["peak_blocks"], f"{r['block_bytes']:,}", f"{r['peak_kv_bytes'] / 1e6:.2f}",
          f"{r['tokens_per_s']:.0f}", r["compiles_in_run"]] for name, r in results.items()])


def summary_line(results: dict[str, dict], ratios: list[float]) -> str:
    """Hybrid over all-full: peak KV bytes and throughput, and the median of the per-round ratios."""
    h, f = results["hybrid"], results["all-full"]
    return (f"hybrid / all-full: peak KV bytes {h['peak_kv_bytes'] / f['peak_kv_bytes']:.3f}, "
            f"throughput {h['tokens_per_s'] / f['tokens_per_s']:.2f}x (median of per-round ratios: "
            f"{1 / float(np.median(ratios)):.2f}x over {len(ratios)} rounds)")
