"""Batched block transfers between the device pool and host memory: one gather, one scatter per step.

Block data travels as one array per block ``[2, num_layers, num_kv_heads,
block_size, head_dim]`` (K then V) in the pool's dtype; fp8 blocks stay fp8,
so a host copy costs what the device block costs. Block-id vectors are padded
to powers of two so the number of compiled shapes stays small; each new
padded count (per pool shape) traces and compiles once in a process
(:func:`transfer_traces` counts them), which is why a KV-transfer engine
warms every count it will need at start.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from jaxpaged.kv_pool.pool import KVPool
from jaxpaged.mathutils import next_power_of_two

_traces: collections.Counter[str] = collections.Counter()  # bumped while tracing: once per compiled shape


def transfer_traces() -> dict[str, int]:
    """How often this process traced the block gather and the block scatter (``{"gather": n, "scatter": m}``):
    once per new padded block count and pool shape, i.e. per compile or persistent-cache load."""
    return {"gather": _traces["gather"], "scatter": _traces["scatter"]}


def padded_counts(max_blocks: int) -> list[int]:
    """Every padded block count a transfer of 1..``max_blocks`` blocks can compile: the powers of two up to
    ``next_power_of_two(max_blocks)``."""
    top = next_power_of_two(max_blocks)
    return [1 << i for i in range(top.bit_length())]


def _padded(ids: list[int], fill: int) -> np.ndarray:
    out = np.full(next_power_of_two(len(ids)), fill, np.int32)
    out[:len(ids)] = ids
    return out


@jax.jit
def _gather(pool: KVPool, block_ids: Int[Array, "P"]) -> Array:
    _traces["gather"] += 1
    k = jnp.stack([pages[:, block_ids] for pages in pool.k])  # [L, Hkv, P, B, D]
    v = jnp.stack([pages[:, block_ids] for pages in pool.v])
    return jnp.moveaxis(jnp.stack([k, v]), 3, 0)  # [P, 2, L, Hkv, B, D]


@functools.partial(jax.jit, donate_argnums=0)
def _scatter(pool: KVPool, block_ids: Int[Array, "P"], data: Array) -> KVPool:
    _traces["scatter"] += 1
    data = jnp.moveaxis(data, 0, 3)  # [2, L, Hkv, P, B, D]
    k = tuple(pages.at[:, block_ids].set(data[0, i], mode="drop") for i, pages in enumerate(pool.k))
    v = tuple(pages.at[:, block_ids].set(data[1, i], mode="drop") for i, pages in enumerate(pool.v))
    return pool._replace(k=k, v=v)


def start_gather(pool: KVPool, block_ids: list[int]) -> Array:
    """Dispatch one gather of the given blocks and start its copy to the host; returns at once."""
    gathered = _gather(pool, jnp.asarray(_padded(block_ids, 0)))
    gathered.copy_to_host_async()
    return gathered


def finish_gather(gathered: Array, num_blocks: int) -> list[np.ndarray]:
    """Wait for a :func:`start_gather` and split it into one host array per block."""
    host = np.asarray(jax.device_get(gathered))
    return [np.array(host[i]) for i in range(num_blocks)]  # own copies: no shared backing buffer


def gather_blocks(pool: KVPool, block_ids: list[int]) -> list[np.ndarray]:
    """Copy the given blocks to host memory in one gather and one transfer; one array per block."""
    if not block_ids:
        return []
    return finish_gather(start_gather(pool, block_ids), len(block_ids))


def scatter_blocks(pool: KVPool, block_ids: list[int], blocks: list[np.ndarray]) -> KVPool:
    """Write host blocks into the given device blocks in one transfer and one donated scatter."""
    if not block_ids:
        return pool
    ids = _padded(block_ids, pool.num_blocks)  # out of range: padding rows are dropped
    data = np.zeros((len(ids),) + blocks[0].shape, blocks[0].dtype)
    data[:len(blocks)] = blocks
    return _scatter(pool, jnp.asarray(ids), jnp.asarray(data))
