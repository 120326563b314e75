"""The CPU attention kernel (cpu_attention.cc): built once per machine, called through the XLA FFI.

XLA:CPU runs paged attention as a gather of every sequence's K/V blocks into a
contiguous copy followed by batched matmuls; at decode the gather dominates
(docs/benchmarks/cpu-performance.md). `cpu_paged_attention` instead calls a small
C++ kernel, for decode rows and prefill chunks alike, that reads the blocks in place through the block table. The kernel
is compiled on first use and cached per machine (`jaxpaged/cpu_kernels.py`).
Where no compiler is found `available()` is False and the engine keeps the XLA
path.
"""

from __future__ import annotations

import functools
import logging
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from jaxpaged import cpu_kernels

log = logging.getLogger(__name__)

KERNEL = cpu_kernels.KernelSource(Path(__file__).with_name("cpu_attention.cc"), "paged_attention")
TARGET = "jaxpaged_paged_attention"
SYMBOL = "JaxpagedPagedAttention"


def available() -> bool:
    """Whether the kernel is built (or can be) and registered with XLA on this machine."""
    return _registered() is not None


@functools.cache
def _registered() -> Path | None:
    """Build the kernel if needed and register it as an FFI target; its path, or None if it cannot be."""
    try:
        library = cpu_kernels.build(KERNEL)
    except (OSError, subprocess.CalledProcessError) as err:
        log.warning("CPU attention kernel not built (%s); the XLA attention path is used", err)
        return None
    cpu_kernels.register(library, SYMBOL, TARGET)
    return library


def cpu_paged_attention(
    q: Float[Array, "T Hq D"],
    k_pages: Float[Array, "Hkv N B D"],
    v_pages: Float[Array, "Hkv N B D"],
    block_tables: Int[Array, "S M"],
    context_lens: Int[Array, "S"],
    query_start: Int[Array, "S"],
    query_lens: Int[Array, "S"],
    *,
    max_query_len: int,
    sm_scale: float,
    k_scale: Float[Array, "Hkv"] | None = None,
    v_scale: Float[Array, "Hkv"] | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> Float[Array, "T Hq D"]:
    """Ragged paged attention with `ragged_paged_attention_reference`'s arguments and result.

    Decode rows (one query) and prefill chunks (several) alike; `max_query_len` is
    not needed by the kernel (it reads each sequence's `query_lens`) and is
    taken for the common signature. `available()` must be True.
    """
    del max_query_len
    if _registered() is None:
        raise RuntimeError("the CPU attention kernel is not available on this machine (no C++ compiler?)")
    num_kv_heads = k_pages.shape[0]
    ones = jnp.ones((num_kv_heads,), jnp.float32)
    k_scale = ones if k_scale is None else k_scale.astype(jnp.float32)
    v_scale = ones if v_scale is None else v_scale.astype(jnp.float32)
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, q.dtype))
    return call(q, k_pages, v_pages, k_scale, v_scale, block_tables.astype(jnp.int32),
                context_lens.astype(jnp.int32), query_start.astype(jnp.int32), query_lens.astype(jnp.int32),
                sm_scale=np.float32(sm_scale), sliding_window=np.int64(sliding_window or 0),
                soft_cap=np.float32(soft_cap or 0.0))
