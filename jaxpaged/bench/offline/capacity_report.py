"""``jaxpaged capacity``: a model's KV capacity on a memory budget, and for sliding-window models the hybrid layout's.

The arithmetic is `jaxpaged.bench.capacity`; this puts the figures a command prints
and writes together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxpaged.bench.capacity import format_capacity, format_hybrid_capacity, hybrid_kv_capacity, kv_capacity
from jaxpaged.config import DEFAULT_BLOCK_SIZE, ModelConfig


def capacity_report(config: ModelConfig, *, budget_bytes: int, context_len: int, kv_dtype: str,
                    weight_dtype: str | None = None, block_size: int = DEFAULT_BLOCK_SIZE,
                    tensor_parallel_size: int = 1, hybrid_context_lens: Sequence[int] = ()) -> tuple[dict, str]:
    """`kv_capacity` as a dict and its text; a model with sliding-window layers adds ``hybrid``, its
    `hybrid_kv_capacity` at each of ``hybrid_context_lens`` (default: ``context_len``)."""
    cap = kv_capacity(config, budget_bytes=budget_bytes, block_size=block_size, context_len=context_len,
                      kv_dtype=kv_dtype, weight_dtype=weight_dtype or kv_dtype,
                      tensor_parallel_size=tensor_parallel_size)
    result, text = dataclasses.asdict(cap), [format_capacity(cap)]
    if any(w is not None for w in config.layer_windows):
        hybrid = [hybrid_kv_capacity(config, budget_bytes=budget_bytes, block_size=block_size, context_len=n,
                                     kv_dtype=kv_dtype) for n in hybrid_context_lens or [context_len]]
        text += [format_hybrid_capacity(h) for h in hybrid]
        result["hybrid"] = [dataclasses.asdict(h) for h in hybrid]
    return result, "\n".join(text)
