"""KV-cache capacity arithmetic: bytes per token, blocks and concurrent sequences for a budget.

Reference figures (Llama-3-70B, fp16 KV): 2 (K and V) x 80 layers x 8 KV heads x
128 dims x 2 bytes = 327,680 bytes per token; a 16-token block is 5,242,880
bytes (about 5.2 MB); 45 GB (decimal) holds 8,583 such blocks (the often quoted
"about 8,700" is 45 GB / 5.2 MB, the block size rounded down). The weights
alone are ~70.6e9 parameters x 2 bytes = ~141 GB in fp16, not ~35 GB.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.config import ModelConfig, dtype_itemsize
from jaxpaged.mathutils import cdiv


@dataclasses.dataclass(frozen=True)
class KVCapacity:
    """What a KV budget holds for one model, KV dtype, block size and context length."""

    config_name: str
    kv_dtype: str
    bytes_per_token: int
    block_size: int
    bytes_per_block: int
    budget_bytes: int
    num_blocks: int
    context_len: int
    blocks_per_seq: int
    max_concurrent_seqs: int
    weight_dtype: str
    num_params: int
    weight_bytes: int
    tensor_parallel_size: int = 1
    kv_shards: int = 1  # slices of the pool over the devices (min(N, KV heads))
    bytes_per_block_per_device: int = 0  # one block's bytes on one device
    weight_bytes_per_device: int = 0  # the split weights' share (norms, ~0.001%, counted as split too)


def max_concurrent_seqs(num_blocks: int, block_size: int, context_len: int) -> int:
    """Sequences of ``context_len`` tokens that fit ``num_blocks`` blocks without sharing."""
    return num_blocks // cdiv(context_len, block_size)


def kv_capacity(config: ModelConfig, *, budget_bytes: int, block_size: int = 16, context_len: int = 2048,
                kv_dtype: str | None = None, weight_dtype: str | None = None,
                tensor_parallel_size: int = 1) -> KVCapacity:
    """Capacity of ``budget_bytes`` of KV cache for ``config`` (dtypes default to the config's).

    With ``tensor_parallel_size`` N, ``budget_bytes`` is each device's KV budget:
    a device holds 1/kv_shards of every block (kv_shards = min(N, KV heads); KV
    heads are replicated beyond that), so the pool has ``budget // (block / kv_shards)``
    blocks, and 1/N of the weights.
    """
    if budget_bytes < 0 or block_size <= 0 or context_len <= 0:
        raise ValueError("budget_bytes must be >= 0, block_size and context_len positive")
    config.check_tensor_parallel(tensor_parallel_size)
    kv_dtype = kv_dtype or config.dtype
    weight_dtype = weight_dtype or config.dtype
    per_token = config.kv_bytes_per_token(kv_dtype)
    per_block = per_token * block_size
    shards = config.kv_shards(tensor_parallel_size)
    per_block_per_device = per_block // shards
    num_blocks = budget_bytes // per_block_per_device
    num_params = config.num_params()
    weight_bytes = num_params * dtype_itemsize(weight_dtype)
    return KVCapacity(
        config_name=config.name, kv_dtype=kv_dtype, bytes_per_token=per_token, block_size=block_size,
        bytes_per_block=per_block, budget_bytes=budget_bytes, num_blocks=num_blocks, context_len=context_len,
        blocks_per_seq=cdiv(context_len, block_size),
        max_concurrent_seqs=max_concurrent_seqs(num_blocks, block_size, context_len),
        weight_dtype=weight_dtype, num_params=num_params, weight_bytes=weight_bytes,
        tensor_parallel_size=tensor_parallel_size, kv_shards=shards, bytes_per_block_per_device=per_block_per_device,
        weight_bytes_per_device=cdiv(weight_bytes, tensor_parallel_size),
    )


def format_capacity(cap: KVCapacity) -> str:
    """A human-readable multi-line summary."""
    tp = []
    if cap.tensor_parallel_size > 1:
        tp = [f"tensor parallel over {cap.tensor_parallel_size} devices: KV in {cap.kv_shards} slices "
              f"({cap.bytes_per_block_per_device / 1e6:.2f} MB of each block per device), "
              f"weights {cap.weight_bytes_per_device / 1e9:.1f} GB per device; the budget is per device"]
    return "\n".join(tp + [
        f"model: {cap.config_name}, KV dtype {cap.kv_dtype}",
        f"KV bytes per token: {cap.bytes_per_token:,}",
        f"block of {cap.block_size} tokens: {cap.bytes_per_block:,} bytes ({cap.bytes_per_block / 1e6:.2f} MB)",
        f"budget {cap.budget_bytes / 1e9:.2f} GB: {cap.num_blocks:,} blocks ({cap.num_blocks * cap.block_size:,} tokens)",
        f"context {cap.context_len:,} tokens = {cap.blocks_per_seq:,} blocks: "
        f"{cap.max_concurrent_seqs:,} concurrent sequences",
        f"weights: {cap.num_params / 1e9:.1f}e9 params x {dtype_itemsize(cap.weight_dtype)} bytes "
        f"({cap.weight_dtype}) = {cap.weight_bytes / 1e9:.1f} GB",
    ])
