"""Moving whole blocks between the device pool and host arrays for snapshots.

Block counts are padded to powers of two (padding reads block 0 and writes out
of range, which is dropped) so save and restore compile a handful of shapes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.buckets import pow2_bucket
from jaxpaged.kv.pool import KVPool


@jax.jit
def _gather(pool: KVPool, ids: jax.Array):
    return [k[:, ids] for k in pool.k], [v[:, ids] for v in pool.v]


@functools.partial(jax.jit, donate_argnums=0)
def _scatter(pool: KVPool, ids: jax.Array, k_new, v_new) -> KVPool:
    def put(pages, new):
        return pages.at[:, ids].set(new.astype(pages.dtype), mode="drop")

    return pool._replace(k=tuple(put(p, n) for p, n in zip(pool.k, k_new)),
                         v=tuple(put(p, n) for p, n in zip(pool.v, v_new)))


def read_blocks(pool: KVPool, block_ids: list[int]) -> dict[str, list[np.ndarray]]:
    """Host copies of blocks `block_ids`: {"k": [layer...], "v": [layer...]}, each [Hkv, n, B, D]."""
    n = len(block_ids)
    ids = np.zeros(pow2_bucket(n), np.int32)
    ids[:n] = block_ids
    k, v = jax.device_get(_gather(pool, jnp.asarray(ids)))
    return {"k": [x[:, :n] for x in k], "v": [x[:, :n] for x in v]}


def write_blocks(pool: KVPool, block_ids: list[int], kv: dict[str, list[np.ndarray]],
                 rows: list[int]) -> KVPool:
    """Return `pool` with block `block_ids[i]` set to row `rows[i]` of `kv` in every layer; pool donated."""
    n = len(block_ids)
    size = pow2_bucket(n)
    ids = np.full(size, pool.num_blocks, np.int32)  # out of range: dropped
    ids[:n] = block_ids
    take = np.zeros(size, np.int64)
    take[:n] = rows

    def padded(layers):
        return [jnp.asarray(np.asarray(x)[:, take]) for x in layers]

    return _scatter(pool, jnp.asarray(ids), padded(kv["k"]), padded(kv["v"]))
