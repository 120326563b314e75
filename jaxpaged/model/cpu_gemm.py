"""Weight GEMMs through oneDNN on XLA:CPU (cpu_gemm.cc), called through the XLA FFI.

`gemm(x, w)` is `x @ w` for float32 or bfloat16 (float32 accumulation), run
by a oneDNN matmul primitive instead of XLA:CPU's dot. The kernel links
against the oneDNN of the `onednn` and `onednn-devel` wheels (the `cpu`
extra) and is built and cached per machine like the other CPU kernels
(`jaxpaged/cpu_kernels.py`). Where the compiler, the headers or the library
are missing, or oneDNN finds no CPU device, `available()` is False (one
warning) and callers keep XLA's dot.

The wheels' oneDNN is its SYCL build (TBB threads): its CPU engine is the
Intel OpenCL CPU runtime of the `intel-opencl-rt` wheel, which the OpenCL
loader finds through `OCL_ICD_FILENAMES` (the wheel's own ICD file names a
placeholder path); `_registered` sets that variable when it is unset.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.metadata
import logging
import math
import os
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from jaxpaged import cpu_kernels
from jaxpaged.model.decoder import DecoderModel

log = logging.getLogger(__name__)

TARGET = "jaxpaged_onednn_gemm"
SYMBOL = "JaxpagedGemm"
SOURCE = Path(__file__).with_name("cpu_gemm.cc")
DTYPES = (jnp.float32, jnp.bfloat16)


def available(dtype=jnp.float32) -> bool:
    """Whether the oneDNN GEMM is built (or can be), registered with XLA, and has a matmul in `dtype` on this
    CPU (the PyPI oneDNN has no bfloat16 matmul on an AVX2-only CPU)."""
    return _registered() is not None and _supports(jnp.dtype(dtype).name)


@functools.cache
def _supports(dtype_name: str) -> bool:
    """Whether oneDNN builds a matmul in `dtype_name` here (logged once when it cannot)."""
    ok = bool(ctypes.cdll.LoadLibrary(str(_registered())).JaxpagedGemmSupports(int(dtype_name == "bfloat16")))
    if not ok:
        log.warning("oneDNN has no %s matmul on this CPU; XLA's dot is used for it", dtype_name)
    return ok


def _wheel_file(distribution: str, suffix: str) -> Path:
    """The installed file of `distribution` whose path ends with `suffix`; OSError when there is none."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError as err:
        raise OSError(f"the {distribution} package is not installed") from err
    for file in files:
        if str(file).endswith(suffix):
            return Path(importlib.metadata.distribution(distribution).locate_file(file)).resolve()
    raise OSError(f"the {distribution} package has no {suffix}")


def _kernel() -> cpu_kernels.KernelSource:
    """The kernel's build description, against the oneDNN wheels' headers and library."""
    header = _wheel_file("onednn-devel", "oneapi/dnnl/dnnl.hpp")
    library_dir = _wheel_file("onednn", "libdnnl.so").parent
    # DT_RPATH, not RUNPATH: it also finds libdnnl's own dependencies (TBB, the SYCL runtime) beside it.
    return cpu_kernels.KernelSource(SOURCE, "onednn_gemm", include_dirs=(str(header.parents[2]),),
                                    link_args=(f"-L{library_dir}", "-ldnnl",
                                               f"-Wl,--disable-new-dtags,-rpath,{library_dir}"))


@functools.cache
def _registered() -> Path | None:
    """Build the kernel if needed, check oneDNN's CPU engine, register the FFI target; None if it cannot be."""
    try:
        kernel = _kernel()
        library = cpu_kernels.build(kernel)
    except (OSError, subprocess.CalledProcessError) as err:
        log.warning("oneDNN GEMM not built (%s); XLA's dot is used", err)
        return None
    opencl_cpu = Path(kernel.link_args[0][2:]) / "libintelocl.so"
    if opencl_cpu.exists():
        os.environ.setdefault("OCL_ICD_FILENAMES", str(opencl_cpu))
    if not ctypes.cdll.LoadLibrary(str(library)).JaxpagedGemmProbe():
        log.warning("oneDNN found no CPU device (OCL_ICD_FILENAMES=%s); XLA's dot is used",
                    os.environ.get("OCL_ICD_FILENAMES"))
        return None
    cpu_kernels.register(library, SYMBOL, TARGET)
    return library


def gemm(x: Float[Array, "... K"], w: Float[Array, "K N"], *, transpose_w: bool = False) -> Float[Array, "... N"]:
    """`x @ w` through oneDNN (`x @ w.T` with `transpose_w`, w then `[N, K]`); x's leading axes are kept.

    x and w must share a dtype, float32 or bfloat16; the result has it too. `available()` must be True.
    """
    if x.dtype != w.dtype or x.dtype not in DTYPES:
        raise ValueError(f"gemm takes float32 or bfloat16 x and w of one dtype, got {x.dtype} and {w.dtype}")
    if not available(x.dtype):
        raise RuntimeError(f"the oneDNN GEMM in {x.dtype} is not available on this machine (see the warning logged)")
    n = w.shape[0] if transpose_w else w.shape[1]
    rows = x.reshape(-1, x.shape[-1])
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((rows.shape[0], n), x.dtype))
    return call(rows, w, transpose_w=transpose_w).reshape(*x.shape[:-1], n)


@dataclasses.dataclass(frozen=True)
class GemmRoute:
    """Which weight GEMMs oneDNN takes: per weight dtype, the row counts `(fewest, most)` it runs."""

    rows: tuple[tuple[str, int, int], ...]

    def takes(self, dtype, num_rows: int) -> bool:
        """Whether a `num_rows`-row product with weights in `dtype` goes to oneDNN."""
        name = jnp.dtype(dtype).name
        return any(name == d and fewest <= num_rows <= most for d, fewest, most in self.rows)


def dot_general(route: GemmRoute, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                out_sharding=None):
    """`jax.lax.dot_general` for a weight product, through oneDNN where `route` takes it.

    A weight product contracts the activations' last axis with a 2-D weight's
    axis 0 (nnx.Linear's `[K, N]` kernel) or axis 1 (a tied embedding's
    `[N, K]`), without batch axes, in one dtype; anything else, and any product
    `route` does not take, is XLA's.
    """
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    weight_product = (rhs.ndim == 2 and not lhs_batch and not rhs_batch and tuple(lhs_contract) == (lhs.ndim - 1,)
                      and len(rhs_contract) == 1 and lhs.dtype == rhs.dtype and lhs.dtype in DTYPES
                      and preferred_element_type in (None, lhs.dtype))
    num_rows = math.prod(lhs.shape[:-1])
    if weight_product and route.takes(rhs.dtype, num_rows):
        return gemm(lhs, rhs, transpose_w=tuple(rhs_contract) == (1,))
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type, out_sharding=out_sharding)


def route_model(model: DecoderModel, route: GemmRoute) -> DecoderModel:
    """A copy of `model` (sharing its arrays) whose projections and LM head run their products through `dot_general`
    with `route`; `model` itself is unchanged."""
    routed = nnx.merge(*nnx.split(model))
    routed_dot = functools.partial(dot_general, route)
    for _, module in nnx.iter_graph(routed):
        if isinstance(module, nnx.Linear):
            module.dot_general = routed_dot
    routed.tied_head_dot_general = routed_dot
    return routed
