"""Step time and memory per device of one model at several tensor-parallel sizes, side by side.

Every runner is built first over the same weights; then each timed round runs
every size's decode step and prefill step once, so machine noise hits every
size alike; the reported time is the median over rounds. Memory per device is
counted from the arrays' shards (weights and pool), not from an allocator.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np

from jaxpaged.bench.offline.step_timing import StepShape, step_pair
from jaxpaged.bench.offline.timing import alternate, seconds_of
from jaxpaged.config import ModelConfig
from jaxpaged.model import init_model
from jaxpaged.report import markdown_table
from jaxpaged.runner import ModelRunner


def most_bytes_on_a_device(tree) -> int:
    """The bytes of a pytree of arrays that the most loaded device holds, counted shard by shard."""
    held = collections.Counter()
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            for shard in leaf.addressable_shards:
                held[shard.device] += shard.data.nbytes
    return max(held.values())


def tensor_parallel_report(config: ModelConfig, sizes: list[int], shape: StepShape, *, block_size: int,
                           rounds: int) -> tuple[dict, str]:
    """Median decode and prefill step times (ms) and bytes on the most loaded device for each size in `sizes`,
    with the setting and the devices it ran on: the result and its table (ratios to the first size)."""
    decode, prefill, num_blocks = step_pair(shape, config.vocab_size, block_size, np.random.default_rng(0))
    model = init_model(config)
    runners = {n: ModelRunner(model, num_blocks, block_size, tensor_parallel_size=n) for n in sizes}
    # each call brings the sampled ids to the host: a full round trip; the warm-up round compiles
    times = alternate({(n, name): seconds_of(lambda r=runner, s=step: r.execute(s)) for n, runner in runners.items()
                       for name, step in (("decode", decode), ("prefill", prefill))}, rounds, warmup=1)
    results = [{"tensor_parallel_size": n, "decode_ms": float(np.median(times[n, "decode"])) * 1e3,
                "prefill_ms": float(np.median(times[n, "prefill"])) * 1e3,
                "weight_bytes_per_device": most_bytes_on_a_device(r.params),
                "pool_bytes_per_device": most_bytes_on_a_device(r.pool), "compiles": r.num_compiles}
               for n, r in runners.items()]
    print(f"{config.name}: decode {shape.decode_batch} x {shape.decode_context} context, prefill {shape.prefill_len} "
          f"tokens; {len(jax.devices())} {jax.default_backend()} devices")
    base = results[0]
    rows = [[r["tensor_parallel_size"], f"{r['decode_ms']:.1f}", f"{r['decode_ms'] / base['decode_ms']:.2f}x",
             f"{r['prefill_ms']:.1f}", f"{r['prefill_ms'] / base['prefill_ms']:.2f}x",
             f"{r['weight_bytes_per_device'] / 1e6:.2f}", f"{r['pool_bytes_per_device'] / 1e6:.2f}", r["compiles"]]
            for r in results]
    table = markdown_table(["TP", "decode step (ms)", "vs TP=1", "prefill step (ms)", "vs TP=1",
                            "weights per device (MB)", "KV pool per device (MB)", "compiles"], rows, align="r" * 8)
    return ({"model": config.name, **dataclasses.asdict(shape), "block_size": block_size, "rounds": rounds,
             "devices": len(jax.devices()), "results": results}, table)
