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
from jaxpaged.report import markdown_table as render_table
from jaxpaged.runner import ModelRunner


@dataclasses.dataclass(frozen=True)
class TPResult:
    """One tensor-parallel size's figures (times in ms, bytes on the most loaded device)."""

    tensor_parallel_size: int
    decode_ms: float
    prefill_ms: float
    weight_bytes_per_device: int
    pool_bytes_per_device: int
    compiles: int


def bytes_per_device(tree) -> dict:
    """Bytes each device holds of a pytree of arrays, counted shard by shard."""
    held = collections.Counter()
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            for shard in leaf.addressable_shards:
                held[shard.device] += shard.data.nbytes
    return held


def bench_tensor_parallel(config: ModelConfig, sizes: list[int], shape: StepShape, *, block_size: int,
                          rounds: int) -> list[TPResult]:
    """Median decode and prefill step times and per-device bytes for each size in `sizes`."""
    decode, prefill, num_blocks = step_pair(shape, config.vocab_size, block_size, np.random.default_rng(0))
    model = init_model(config)
    runners = {n: ModelRunner(model, num_blocks, block_size, tensor_parallel_size=n) for n in sizes}
    # each call brings the sampled ids to the host: a full round trip; the warm-up round compiles
    times = alternate({(n, name): seconds_of(lambda r=runner, s=step: r.execute(s)) for n, runner in runners.items()
                       for name, step in (("decode", decode), ("prefill", prefill))}, rounds, warmup=1)
    return [TPResult(n, float(np.median(times[n, "decode"])) * 1e3, float(np.median(times[n, "prefill"])) * 1e3,
                     max(bytes_per_device(r.params).values()), max(bytes_per_device(r.pool).values()),
                     r.num_compiles)
            for n, r in runners.items()]


def markdown_table(results: list[TPResult]) -> str:
    """The results as a Markdown table, with ratios to the first size."""
    base = results[0]
    rows = [[r.tensor_parallel_size, f"{r.decode_ms:.1f}", f"{r.decode_ms / base.decode_ms:.2f}x",
             f"{r.prefill_ms:.1f}", f"{r.prefill_ms / base.prefill_ms:.2f}x", f"{r.weight_bytes_per_device / 1e6:.2f}",
             f"{r.pool_bytes_per_device / 1e6:.2f}", r.compiles] for r in results]
    return render_table(["TP", "decode step (ms)", "vs TP=1", "prefill step (ms)", "vs TP=1", "weights per device (MB)",
                         "KV pool per device (MB)", "compiles"], rows, align="r" * 8)


def tensor_parallel_report(config: ModelConfig, sizes: list[int], shape: StepShape, *, block_size: int,
                           rounds: int) -> tuple[dict, str]:
    """`bench_tensor_parallel`, with the setting and the devices it ran on: the result and its table."""
    results = bench_tensor_parallel(config, sizes, shape, block_size=block_size, rounds=rounds)
    print(f"{config.name}: decode {shape.decode_batch} x {shape.decode_context} context, prefill {shape.prefill_len} "
          f"tokens; {len(jax.devices())} {jax.default_backend()} devices")
    return ({"model": config.name, **dataclasses.asdict(shape), "block_size": block_size, "rounds": rounds,
             "devices": len(jax.devices()), "results": [dataclasses.asdict(r) for r in results]},
            markdown_table(results))
