"""Capacity planner: how many blocks, tokens and full-length sequences a KV byte budget holds."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxpaged.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class CapacityPlan:
    """What a fixed KV budget holds for one model, block size and KV dtype."""

    kv_dtype: str
    bytes_per_token: int
    num_blocks: int
    num_tokens: int
    max_concurrent_seqs: int  # sequences of `seq_len` tokens that fit at once

    def as_dict(self) -> dict:
        """Plain-dict form (JSON)."""
        return dataclasses.asdict(self)


def plan_capacity(config: ModelConfig, kv_cache_bytes: int, block_size: int, kv_dtype,
                  seq_len: int) -> CapacityPlan:
    """Blocks, tokens and concurrent `seq_len`-token sequences that `kv_cache_bytes` holds.

    Raises:
      ValueError: a non-positive budget, block size or sequence length.
    """
    if kv_cache_bytes <= 0 or block_size <= 0 or seq_len <= 0:
        raise ValueError(f"kv_cache_bytes, block_size and seq_len must be positive, got "
                         f"{kv_cache_bytes}, {block_size}, {seq_len}")
    name = jnp.dtype(kv_dtype).name
    per_token = config.kv_bytes_per_token(name)
    num_blocks = kv_cache_bytes // (per_token * block_size)
    blocks_per_seq = -(-seq_len // block_size)
    return CapacityPlan(name, per_token, num_blocks, num_blocks * block_size, num_blocks // blocks_per_seq)
