"""The CPU decode-attention kernel (cpu_decode.cc): built once per machine, called through the XLA FFI.

XLA:CPU runs paged attention as a gather of every sequence's K/V blocks into a
contiguous copy followed by batched matmuls; at decode the gather dominates
(docs/benchmarks/cpu-performance.md). `cpu_paged_decode` instead calls a small
C++ kernel that reads the blocks in place through the block table. The kernel
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

KERNEL = cpu_kernels.KernelSource(Path(__file__).with_name("cpu_decode.cc"), "paged_decode")
TARGET = "jaxpaged_paged_decode"
SYMBOL = "JaxpagedPagedDecode"


def available() -> bool:
    """Whether the kernel is built (or can be) and registered with XLA on this machine."""
    return _registered() is not None


@functools.cache
def _registered() -> Path | None:
    """Build the kernel if needed and register it as an FFI target; its path, or None if it cannot be."""
    try:
        library = cpu_kernels.build(KERNEL)
    except (OSError, subprocess.CalledProcessError) as err:
        log.warning("CPU decode attention kernel not built (%s); the XLA attention path is used", err)
        return None
    cpu_kernels.register(library, SYMBOL, TARGET)
    return library


def cpu_paged_decode(
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
    """Decode attention (one query per sequence) with `ragged_paged_attention_reference`'s arguments and result.

    Only `max_query_len == 1` is taken (the decode group of a step); `available()` must be True.
    """
    if max_query_len != 1:
        raise ValueError(f"the CPU decode kernel takes one query per sequence, got max_query_len={max_query_len}")
    if _registered() is None:
        raise RuntimeError("the CPU decode attention kernel is not available on this machine (no C++ compiler?)")
    num_kv_heads = k_pages.shape[0]
    ones = jnp.ones((num_kv_heads,), jnp.float32)
    k_scale = ones if k_scale is None else k_scale.astype(jnp.float32)
    v_scale = ones if v_scale is None else v_scale.astype(jnp.float32)
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, q.dtype))
    return call(q, k_pages, v_pages, k_scale, v_scale, block_tables.astype(jnp.int32),
                context_lens.astype(jnp.int32), query_start.astype(jnp.int32), query_lens.astype(jnp.int32),
                sm_scale=np.float32(sm_scale), sliding_window=np.int64(sliding_window or 0),
                soft_cap=np.float32(soft_cap or 0.0))
