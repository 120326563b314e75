"""The paged KV pool: a pytree of immutable arrays, one K and one V array per pool tensor.

A pool tensor is one layer's pages for an all-full-attention model. With KV
cache groups (sliding-window layers, `jaxpaged.cache.kv_groups`), tensor `j` is
shared by the `j`-th layer of every group: a block id belongs to one group at a
time, so the pool holds `group_size` tensors, not `num_layers`.

Layout per layer: `[num_kv_heads, num_blocks, block_size, head_dim]` (head-major).
Token `t` of physical block `b` lives at flat slot `b * block_size + t`; the host
tells the device which slot each new token goes to (`slot_mapping`, -1 = padding).
Layers are separate arrays, not one stacked array, so a kernel can take one
layer's pool as an operand without XLA materialising a slice of it.

An fp8 pool (float8_e4m3fn) carries float32 scales per layer and KV head:
stored = clip(x / scale, ±448); read = stored * scale.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from jaxpaged.cache.kv_groups import kv_cache_layout
from jaxpaged.config import ModelConfig, canonical_dtype_name

FP8_MAX = 448.0  # largest finite float8_e4m3fn

# The step's K/V write scatters at least this many slots (padding slots are dropped). XLA rewrites a
# one-index scatter into a dynamic-update-slice, and with out-of-bounds writes dropped and the pool
# read again later in the step, the compiled step then copied every layer's whole pool: a
# one-sequence decode cost O(pool size), ~0.8 s for 4,200 blocks of `small`. (copy_blocks and the
# offload scatter, jitted on their own, compile in place with one index; checked, not padded.)
MIN_SCATTER_INDICES = 2


class KVPool(NamedTuple):
    """All layers' K/V pages, plus per-layer-per-head scales (1.0 unless fp8)."""

    k: tuple[Array, ...]  # per pool tensor, each [num_kv_heads, num_blocks, block_size, head_dim]
    v: tuple[Array, ...]
    k_scale: Float[Array, "L Hkv"]
    v_scale: Float[Array, "L Hkv"]

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[1]

    @property
    def block_size(self) -> int:
        return self.k[0].shape[2]

    @property
    def dtype(self):
        return self.k[0].dtype

    @property
    def is_fp8(self) -> bool:
        return self.k[0].dtype == jnp.float8_e4m3fn


def kv_dtype_from_name(name: str | None, model_dtype: str) -> jnp.dtype:
    """Map a user-facing KV dtype name (`auto`, `fp8_e4m3`, `bfloat16`, ...) to a JAX dtype."""
    if name in (None, "auto"):
        return jnp.dtype(model_dtype)
    try:
        return jnp.dtype(canonical_dtype_name(name))
    except ValueError as e:
        raise ValueError(f"kv_cache_dtype: {e} (or 'auto')") from None


def create_pool(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype=None,
    *,
    fill_value: float = 0.0,
    k_scale: np.ndarray | None = None,
    v_scale: np.ndarray | None = None,
) -> KVPool:
    """Allocate a pool of `num_blocks` blocks of `block_size` tokens for every layer.

    `fill_value=float("nan")` poisons every slot, which tests use to prove that
    attention never reads a slot a sequence does not own.
    """
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
    dtype = jnp.dtype(dtype or config.dtype)
    shape = (config.num_kv_heads, num_blocks, block_size, config.head_dim)
    fill = jnp.asarray(fill_value, jnp.float32).astype(dtype)
    num_tensors = num_pool_tensors(config)
    k = tuple(jnp.full(shape, fill, dtype) for _ in range(num_tensors))
    v = tuple(jnp.full(shape, fill, dtype) for _ in range(num_tensors))
    scale_shape = (config.num_layers, config.num_kv_heads)
    ks = jnp.ones(scale_shape, jnp.float32) if k_scale is None else jnp.asarray(k_scale, jnp.float32)
    vs = jnp.ones(scale_shape, jnp.float32) if v_scale is None else jnp.asarray(v_scale, jnp.float32)
    if ks.shape != scale_shape or vs.shape != scale_shape:
        raise ValueError(f"kv scales must have shape {scale_shape}, got {ks.shape} and {vs.shape}")
    return KVPool(k, v, ks, vs)


def num_pool_tensors(config: ModelConfig) -> int:
    """K (and V) arrays the pool holds: one per layer, or the KV cache group size with sliding windows."""
    return kv_cache_layout(config.layer_windows).num_tensors


def pool_bytes(config: ModelConfig, num_blocks: int, block_size: int, dtype) -> int:
    """Device bytes of a pool (K and V over all pool tensors)."""
    per_layer = config.kv_bytes_per_token(jnp.dtype(dtype).name) // config.num_layers
    return num_blocks * block_size * per_layer * num_pool_tensors(config)


def write_layer_kv(
    k_pages: Float[Array, "Hkv N B D"],
    v_pages: Float[Array, "Hkv N B D"],
    k_new: Float[Array, "T Hkv D"],
    v_new: Float[Array, "T Hkv D"],
    slot_mapping: Int[Array, "T"],
    k_scale: Float[Array, "Hkv"],
    v_scale: Float[Array, "Hkv"],
) -> tuple[Array, Array]:
    """Scatter this step's new K/V rows into their slots; slot -1 (padding) is dropped."""
    num_kv_heads, num_blocks, block_size, head_dim = k_pages.shape
    num_slots = num_blocks * block_size
    slots = jnp.where(slot_mapping < 0, num_slots, slot_mapping)
    pad = MIN_SCATTER_INDICES - slots.shape[0]
    if pad > 0:  # see MIN_SCATTER_INDICES: a dropped padding row keeps the write a scatter
        slots = jnp.concatenate([slots, jnp.full((pad,), num_slots, slots.dtype)])
        k_new = jnp.concatenate([k_new, jnp.zeros((pad, *k_new.shape[1:]), k_new.dtype)])
        v_new = jnp.concatenate([v_new, jnp.zeros((pad, *v_new.shape[1:]), v_new.dtype)])

    def scatter(pages, new, scale):
        new = jnp.swapaxes(new, 0, 1)  # [Hkv, T, D]
        if pages.dtype == jnp.float8_e4m3fn:
            new = jnp.clip(new.astype(jnp.float32) / scale[:, None, None], -FP8_MAX, FP8_MAX)
        flat = pages.reshape(num_kv_heads, num_slots, head_dim)
        flat = flat.at[:, slots].set(new.astype(pages.dtype), mode="drop")
        return flat.reshape(pages.shape)

    return scatter(k_pages, k_new, k_scale), scatter(v_pages, v_new, v_scale)


@functools.partial(jax.jit, donate_argnums=0)
def copy_blocks(pool: KVPool, src: Int[Array, "P"], dst: Int[Array, "P"]) -> KVPool:
    """Copy whole blocks `src[i] -> dst[i]` in every layer (copy-on-write); pool donated.

    A `dst` outside the pool (e.g. `num_blocks`) is a padding pair and is dropped.
    """

    def copy(pages):
        return pages.at[:, dst].set(pages[:, jnp.clip(src, 0, pages.shape[1] - 1)], mode="drop")

    return pool._replace(k=tuple(copy(p) for p in pool.k), v=tuple(copy(p) for p in pool.v))
