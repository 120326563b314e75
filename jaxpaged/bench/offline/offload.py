"""Benchmarks for the memory tiers and the fp8 KV cache (driven by `jaxpaged bench offload`).

* TTFT of a long shared prefix: recomputed, hit in the host tier, hit on the device.
* A fixed KV byte budget: capacity (planner), throughput and peak concurrency, fp8 vs the default dtype.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

from jaxpaged.bench.capacity import kv_capacity
from jaxpaged.checkpoint import model_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.mathutils import cdiv
from jaxpaged.model import init_model
from jaxpaged.report import markdown_table
from jaxpaged.sampling_params import SamplingParams

FIRST_TOKEN = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


def _ttft(engine: Engine, request_id: str, prompt: list[int]) -> tuple[float, int]:
    """Seconds from submission to the first token, and the prompt tokens served from a cache."""
    start = time.perf_counter()
    engine.add_request(request_id, prompt, FIRST_TOKEN)
    while engine.has_unfinished_requests():
        for out in engine.step():
            return time.perf_counter() - start, out.num_cached_tokens
    raise RuntimeError("request produced no output")


def bench_ttft(model_name: str, prefix_len: int, repeats: int, block_size: int = EngineConfig.block_size,
               max_num_batched_tokens: int = 512, host_cache_bytes: int = 1 << 30) -> dict:
    """Median TTFT for a `prefix_len`-token prefix: recompute, host-tier hit, device hit.

    The device pool holds one prefix plus a little: an unrelated prompt of the same
    length evicts the prefix into the host tier between the device hit and the host hit.
    The host-hit step also offloads that unrelated prompt's blocks (one transfer each way).
    """
    config, tail = model_config(model_name), 16
    engine = Engine(EngineConfig(model=model_name, block_size=block_size,
                                 num_blocks=cdiv(prefix_len + tail, block_size) + 8,
                                 max_num_batched_tokens=max_num_batched_tokens,
                                 host_cache_bytes=host_cache_bytes), model=init_model(config))
    rng = np.random.default_rng(0)
    vocab = min(config.vocab_size, 250)
    times: dict[str, list[float]] = {"recompute": [], "device_hit": [], "host_hit": []}
    cached: dict[str, list[int]] = {k: [] for k in times}
    for rep in range(repeats + 1):  # round 0 compiles every shape and is not counted
        prefix = list(rng.integers(0, vocab, prefix_len))
        runs = [("recompute", prefix), ("device_hit", prefix), ("evict", None), ("host_hit", prefix)]
        for kind, head in runs:
            prompt = list(rng.integers(0, vocab, prefix_len + tail)) if head is None else head + list(
                rng.integers(0, vocab, tail))
            seconds, num_cached = _ttft(engine, f"{kind}-{rep}", prompt)
            if rep and kind in times:
                times[kind].append(seconds)
                cached[kind].append(num_cached)
    result = {k: {"ttft_s": statistics.median(v), "cached_tokens": statistics.median(cached[k])}
              for k, v in times.items()}
    result["host_hit_vs_recompute_speedup"] = result["recompute"]["ttft_s"] / result["host_hit"]["ttft_s"]
    result["tier_stats"] = dataclasses.asdict(engine.tier_stats())
    return result


def capacity_table(model_names: list[str], kv_cache_bytes: int, block_size: int, seq_len: int) -> list[dict]:
    """The planner's blocks, tokens and concurrent sequences per model and KV dtype at one budget."""
    rows = []
    for name in model_names:
        config = model_config(name)
        for dtype_name in ("float32", "bfloat16", "fp8_e4m3"):
            cap = kv_capacity(config, budget_bytes=kv_cache_bytes, block_size=block_size, context_len=seq_len,
                              kv_dtype=dtype_name)
            rows.append({"model": name, **dataclasses.asdict(cap), "num_tokens": cap.num_blocks * block_size})
    return rows


def bench_budget(model_name: str, kv_cache_bytes: int, num_requests: int, prompt_len: int,
                 max_tokens: int, kv_dtypes: tuple[str, ...] = ("auto", "fp8_e4m3"),
                 max_num_seqs: int = 256, max_num_batched_tokens: int = 1024) -> list[dict]:
    """Serve the same batch at one KV byte budget per dtype: throughput, peak concurrency, preemptions.

    The first request of each run (which compiles shapes and calibrates fp8) is run alone and not timed.
    """
    config = model_config(model_name)
    model = init_model(config)
    rng = np.random.default_rng(1)
    vocab = min(config.vocab_size, 250)
    prompts = [list(rng.integers(0, vocab, prompt_len)) for _ in range(num_requests + 1)]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    rows = []
    for dtype_name in kv_dtypes:
        engine = Engine(EngineConfig(model=model_name, kv_cache_bytes=kv_cache_bytes, kv_cache_dtype=dtype_name,
                                     max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                     enable_prefix_caching=False), model=model)
        engine.add_request("warm", prompts[0], params)
        while engine.has_unfinished_requests():
            engine.step()
        for i, prompt in enumerate(prompts[1:]):
            engine.add_request(str(i), prompt, params)
        peak, generated, start = 0, 0, time.perf_counter()
        while engine.has_unfinished_requests():
            for out in engine.step():
                generated += len(out.outputs[0].token_ids)
            peak = max(peak, engine.load().num_running)
        seconds = time.perf_counter() - start
        rows.append({"kv_cache_dtype": dtype_name, "num_blocks": engine.num_blocks,
                     "peak_concurrent_seqs": peak, "preemptions": engine.num_preemptions,
                     "generated_tokens": generated, "seconds": seconds,
                     "throughput_tok_s": generated / seconds, "compiles": engine.num_compiles})
    return rows


def markdown(results: dict) -> str:
    """Markdown tables of `bench_ttft`, `capacity_table` and `bench_budget` results."""
    tables = []
    if "ttft" in results:
        t = results["ttft"]
        tables.append(markdown_table(["prefix", "TTFT (s, median)", "tokens served from a cache"],
                                     [[k, f"{t[k]['ttft_s']:.3f}", f"{t[k]['cached_tokens']:.0f}"]
                                      for k in ("recompute", "host_hit", "device_hit")]))
        tables.append(f"host hit vs recompute: {t['host_hit_vs_recompute_speedup']:.2f}x faster")
    if "capacity" in results:
        tables.append(markdown_table(["model", "KV dtype", "bytes/token", "blocks", "tokens", "concurrent seqs"],
                                     [[r["model"], r["kv_dtype"], f"{r['bytes_per_token']:,}", f"{r['num_blocks']:,}",
                                       f"{r['num_tokens']:,}", f"{r['max_concurrent_seqs']:,}"]
                                      for r in results["capacity"]]))
    if "budget" in results:
        tables.append(markdown_table(["KV dtype", "blocks", "peak concurrent seqs", "preemptions", "tokens/s",
                                      "compiles"],
                                     [[r["kv_cache_dtype"], r["num_blocks"], r["peak_concurrent_seqs"],
                                       r["preemptions"], f"{r['throughput_tok_s']:.1f}", r["compiles"]]
                                      for r in results["budget"]]))
    return "\n\n".join(tables) + "\n"
