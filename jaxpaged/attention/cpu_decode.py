"""The CPU decode-attention kernel (cpu_decode.cc): built once per machine, called through the XLA FFI.

XLA:CPU runs paged attention as a gather of every sequence's K/V blocks into a
contiguous copy followed by batched matmuls; at decode the gather dominates
(docs/benchmarks/cpu-performance.md). `cpu_paged_decode` instead calls a small
C++ kernel that reads the blocks in place through the block table. The kernel
is compiled on first use with the system C++ compiler against the XLA FFI
headers jaxlib ships, into the per-user cache (`$JAXPAGED_CPU_KERNEL_DIR`, else
`~/.cache/jaxpaged/cpu-kernels`), keyed by the source, the jaxlib version and
the CPU's instruction-set flags. Where no compiler is found `available()` is
False and the engine keeps the XLA path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from jaxtyping import Array, Float, Int

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_decode.cc")
TARGET = "jaxpaged_paged_decode"
SYMBOL = "JaxpagedPagedDecode"
CACHE_ENV = "JAXPAGED_CPU_KERNEL_DIR"
# -ffast-math lets the compiler vectorise exp; it is given to the compile step only, because linking
# with it adds crtfastmath.o, which would turn on flush-to-zero for the whole process.
COMPILE_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp-simd", "-std=c++17", "-fPIC")
LINK_FLAGS = ("-shared",)


def available() -> bool:
    """Whether the kernel is built (or can be) and registered with XLA on this machine."""
    return _registered() is not None


@functools.cache
def _registered() -> Path | None:
    """Build the kernel if needed and register it as an FFI target; its path, or None if it cannot be."""
    try:
        library = _build()
    except (OSError, subprocess.CalledProcessError) as err:
        log.warning("CPU decode attention kernel not built (%s); the XLA attention path is used", err)
        return None
    handle = ctypes.cdll.LoadLibrary(str(library))
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(getattr(handle, SYMBOL)), platform="cpu")
    return library


def _build() -> Path:
    """The compiled kernel's path, compiling it into the cache first when it is not there."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise OSError("no C++ compiler (c++, g++ or clang++) on PATH")
    library = _cache_dir() / f"paged_decode-{_build_key(compiler)}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name and renamed: parallel test workers may build at once.
    with tempfile.NamedTemporaryFile(dir=library.parent, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        obj = partial.with_suffix(".o")
        subprocess.run([compiler, *COMPILE_FLAGS, "-I", jax.ffi.include_dir(), "-c", str(SOURCE), "-o", str(obj)],
                       check=True, capture_output=True, text=True)
        subprocess.run([compiler, *LINK_FLAGS, str(obj), "-o", str(partial)], check=True, capture_output=True,
                       text=True)
        os.replace(partial, library)
    finally:
        partial.unlink(missing_ok=True)
        partial.with_suffix(".o").unlink(missing_ok=True)
    return library


def _cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jaxpaged" / "cpu-kernels"


def _build_key(compiler: str) -> str:
    """A digest of what the binary depends on: source, flags, compiler, jaxlib and the CPU's features."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(" ".join((compiler, *COMPILE_FLAGS, *LINK_FLAGS, jaxlib.__version__, platform.machine(), _cpu_flags())).encode())
    return digest.hexdigest()[:16]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


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
