"""KV-cache capacity arithmetic (``jaxpaged capacity``): bytes per token, blocks and concurrent sequences for a
budget, and for sliding-window models the hybrid layout's (docs/benchmarks/block-size.md, hybrid-kv.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxpaged.config import DEFAULT_BLOCK_SIZE, ModelConfig, dtype_itemsize
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


def _check(budget_bytes: int, block_size: int, context_len: int) -> None:
    if budget_bytes < 0 or block_size <= 0 or context_len <= 0:
        raise ValueError("budget_bytes must be >= 0, block_size and context_len positive")


def max_concurrent_seqs(num_blocks: int, block_size: int, context_len: int) -> int:
    """Sequences of ``context_len`` tokens that fit ``num_blocks`` blocks without sharing."""
    return num_blocks // cdiv(context_len, block_size)


def kv_capacity(config: ModelConfig, *, budget_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE,
                context_len: int = 2048, kv_dtype: str | None = None, weight_dtype: str | None = None,
                tensor_parallel_size: int = 1) -> KVCapacity:
    """Capacity of ``budget_bytes`` of KV cache for ``config`` (dtypes default to the config's).

    With ``tensor_parallel_size`` N, ``budget_bytes`` is each device's KV budget:
    a device holds 1/kv_shards of every block (kv_shards = min(N, KV heads); KV
    heads are replicated beyond that), so the pool has ``budget // (block / kv_shards)``
    blocks, and 1/N of the weights.
    """
    _check(budget_bytes, block_size, context_len)
    config.check_tensor_parallel(tensor_parallel_size)
    kv_dtype, weight_dtype = kv_dtype or config.dtype, weight_dtype or config.dtype
    per_token = config.kv_bytes_per_token(kv_dtype)
    per_block, shards = per_token * block_size, config.kv_shards(tensor_parallel_size)
    per_block_per_device = per_block // shards
    num_blocks, num_params = budget_bytes // per_block_per_device, config.num_params()
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


@dataclasses.dataclass(frozen=True)
class HybridCapacity:
    """KV bytes per sequence and concurrent sequences with KV cache groups vs every layer treated as full.

    Hybrid: ``num_groups`` groups of ``group_size`` layers share one block-id space; a
    block is ``group_size`` layers' page (``bytes_per_block``), a full group holds every
    block of the context and a sliding group only its window's (``blocks_for_context``).
    All-full: the usual pool, one page per layer per block.
    """

    config_name: str
    kv_dtype: str
    context_len: int
    block_size: int
    budget_bytes: int
    num_groups: int
    group_size: int
    hybrid_bytes_per_block: int
    hybrid_num_blocks: int
    hybrid_blocks_per_seq: int
    hybrid_bytes_per_seq: int
    hybrid_max_concurrent_seqs: int
    full_bytes_per_block: int
    full_num_blocks: int
    full_blocks_per_seq: int
    full_bytes_per_seq: int
    full_max_concurrent_seqs: int

    @property
    def kv_saving(self) -> float:
        """Fraction of an all-full sequence's KV bytes the hybrid layout does not hold."""
        return 1.0 - self.hybrid_bytes_per_seq / self.full_bytes_per_seq


def hybrid_kv_capacity(config: ModelConfig, *, budget_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE,
                       context_len: int = 2048, kv_dtype: str | None = None) -> HybridCapacity:
    """Capacity of ``budget_bytes`` with KV cache groups (sliding ones free old blocks) vs all layers full.

    A sequence is counted at ``context_len`` tokens after its last step, holding
    what the KV cache manager keeps then (vLLM counts the same way); no sharing.
    """
    from jaxpaged.cache.kv_groups import blocks_for_context, kv_cache_layout

    _check(budget_bytes, block_size, context_len)
    kv_dtype = kv_dtype or config.dtype
    layout = kv_cache_layout(config.layer_windows)
    per_layer_token = config.kv_bytes_per_token(kv_dtype) // config.num_layers
    hybrid_block = per_layer_token * layout.num_tensors * block_size
    hybrid_blocks = sum(blocks_for_context(w, context_len, block_size) for w in layout.windows)
    full_block = per_layer_token * config.num_layers * block_size
    full_blocks = cdiv(context_len, block_size)
    hybrid_pool, full_pool = budget_bytes // hybrid_block, budget_bytes // full_block
    return HybridCapacity(
        config_name=config.name, kv_dtype=kv_dtype, context_len=context_len, block_size=block_size,
        budget_bytes=budget_bytes, num_groups=layout.num_groups, group_size=layout.num_tensors,
        hybrid_bytes_per_block=hybrid_block, hybrid_num_blocks=hybrid_pool, hybrid_blocks_per_seq=hybrid_blocks,
        hybrid_bytes_per_seq=hybrid_blocks * hybrid_block, hybrid_max_concurrent_seqs=hybrid_pool // hybrid_blocks,
        full_bytes_per_block=full_block, full_num_blocks=full_pool, full_blocks_per_seq=full_blocks,
        full_bytes_per_seq=full_blocks * full_block, full_max_concurrent_seqs=full_pool // full_blocks)


def format_hybrid_capacity(cap: HybridCapacity) -> str:
    """One summary line per layout (hybrid KV cache groups, all layers full)."""
    return "\n".join([
        f"KV cache groups: {cap.num_groups} of {cap.group_size} layers (block {cap.hybrid_bytes_per_block:,} bytes)",
        f"context {cap.context_len:,}: hybrid {cap.hybrid_bytes_per_seq / 1e9:.3f} GB per sequence, "
        f"{cap.hybrid_max_concurrent_seqs:,} concurrent; all-full {cap.full_bytes_per_seq / 1e9:.3f} GB, "
        f"{cap.full_max_concurrent_seqs:,} concurrent ({cap.kv_saving:.1%} of the KV bytes saved)",
    ])


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
