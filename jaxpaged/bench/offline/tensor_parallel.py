"""Step time and memory per device of one model at several tensor-parallel sizes, side by side.

Every runner is built first over the same weights; then each timed round runs
every size's decode step and prefill step once, so machine noise hits every
size alike; the reported time is the median over rounds. Memory per device is
counted from the arrays' shards (weights and pool), not from an allocator.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import jax
import numpy as np

from jaxpaged.config import ModelConfig
from jaxpaged.mathutils import cdiv
from jaxpaged.model import init_model
from jaxpaged.report import markdown_table as render_table
from jaxpaged.runner import ModelRunner
from jaxpaged.runner.step_input import ScheduledSeq, StepInput, build_step_input


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


def _steps(num_blocks_per_seq: int, decode_batch: int, context: int, prefill_len: int,
           block_size: int, vocab: int) -> tuple[StepInput, StepInput]:
    rng = np.random.default_rng(0)
    tables = np.arange(num_blocks_per_seq * (decode_batch + 1)).reshape(-1, num_blocks_per_seq)
    prefill = build_step_input([ScheduledSeq(rng.integers(0, vocab, prefill_len).tolist(), 0, tables[0])],
                               block_size)
    decode = build_step_input([ScheduledSeq([int(rng.integers(0, vocab))], context, tables[i + 1])
                               for i in range(decode_batch)], block_size)
    return decode, prefill


def bench_tensor_parallel(config: ModelConfig, sizes: list[int], *, decode_batch: int, context: int,
                          prefill_len: int, block_size: int, rounds: int) -> list[TPResult]:
    """Median decode and prefill step times and per-device bytes for each size in `sizes`."""
    blocks_per_seq = cdiv(max(prefill_len, context + 1), block_size)
    num_blocks = blocks_per_seq * (decode_batch + 1)
    model = init_model(config)
    runners = {n: ModelRunner(model, num_blocks, block_size, tensor_parallel_size=n) for n in sizes}
    decode, prefill = _steps(blocks_per_seq, decode_batch, context, prefill_len, block_size, config.vocab_size)
    times = {n: {"decode": [], "prefill": []} for n in sizes}
    for runner in runners.values():  # compile and warm up outside the timed rounds
        runner.execute(decode)
        runner.execute(prefill)
    for _ in range(rounds):
        for n, runner in runners.items():
            for name, step in (("decode", decode), ("prefill", prefill)):
                start = time.perf_counter()
                runner.execute(step)  # brings the sampled ids to the host: a full round trip
                times[n][name].append(time.perf_counter() - start)
    return [TPResult(n, float(np.median(times[n]["decode"])) * 1e3, float(np.median(times[n]["prefill"])) * 1e3,
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


def tensor_parallel_report(config: ModelConfig, sizes: list[int], *, decode_batch: int, context: int,
                           prefill_len: int, block_size: int, rounds: int) -> tuple[dict, str]:
    """`bench_tensor_parallel`, with the setting and the devices it ran on: the result and its table."""
    results = bench_tensor_parallel(config, sizes, decode_batch=decode_batch, context=context,
                                    prefill_len=prefill_len, block_size=block_size, rounds=rounds)
    print(f"{config.name}: decode {decode_batch} x {context} context, prefill {prefill_len} "
          f"tokens; {len(jax.devices())} {jax.default_backend()} devices")
    return ({"model": config.name, "decode_batch": decode_batch, "decode_context": context,
             "prefill_len": prefill_len, "block_size": block_size, "rounds": rounds, "devices": len(jax.devices()),
             "results": [dataclasses.asdict(r) for r in results]}, markdown_table(results))
