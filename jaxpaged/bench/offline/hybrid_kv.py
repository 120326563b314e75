"""The hybrid KV cache manager against every layer full, on a tiny Gemma-3-like model (`jaxpaged bench hybrid-kv`).

The same prompts and weights served twice: with the model's sliding windows
(KV cache groups) and with every layer full attention; each engine warmed up on
a pass of the same shapes first, so the timed passes compile nothing.
"""

from __future__ import annotations

import itertools
import time

from jaxpaged.config import load_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.model import init_model
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
