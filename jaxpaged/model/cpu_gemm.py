"""Weight GEMMs through oneDNN (cpu_gemm.cc) or MKL (mkl_gemm.cc) on XLA:CPU, called through the XLA FFI.

`gemm(x, w, library=...)` is `x @ w` run by a library instead of XLA:CPU's
dot: ``"onednn"``, a oneDNN matmul, float32 or bfloat16 (float32
accumulation); ``"mkl"``, MKL's `cblas_sgemm`, float32 only. Each kernel
links against its library's wheels (the `cpu` extra: `onednn` and
`onednn-devel`, `mkl` and `mkl-include`) and is built and cached per machine
like the other CPU kernels (`jaxpaged/cpu_kernels.py`). Where the compiler,
the headers or the library are missing, or the library cannot run here,
`available(library)` is False (one warning) and callers keep XLA's dot.

The oneDNN wheels are its SYCL build (TBB threads): its CPU engine is the
Intel OpenCL CPU runtime of the `intel-opencl-rt` wheel, which the OpenCL
loader finds through `OCL_ICD_FILENAMES` (the wheel's own ICD file names a
placeholder path); `_registered` sets that variable when it is unset.

MKL runs on `MKL_THREADING` (its OpenMP layer, the `intel-openmp` wheel's
libiomp5, loaded first so MKL finds it wherever the wheels put it) with
`KMP_BLOCKTIME=0` unless set: OpenMP's threads then sleep as soon as a
product ends instead of spinning against XLA's own threads for the cores.
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

ONEDNN, MKL = "onednn", "mkl"
TARGET = "jaxpaged_onednn_gemm"
MKL_TARGET = "jaxpaged_mkl_sgemm"
SHAPE_HEADER = Path(__file__).with_name("cpu_gemm_shape.h")  # included by both kernels
# MKL's threading layer (MKL_Set_Threading_Layer): 0 OpenMP (libiomp5), 1 sequential, 4 TBB
MKL_THREADING = 0


@dataclasses.dataclass(frozen=True)
class Library:
    """A GEMM library's kernel: its source, FFI target and handler, its probe function, the dtypes it takes."""

    name: str
    source: Path
    target: str
    symbol: str
    probe: str
    dtypes: tuple


LIBRARIES = {
    ONEDNN: Library("oneDNN", Path(__file__).with_name("cpu_gemm.cc"), TARGET, "JaxpagedGemm",
                    "JaxpagedGemmProbe", (jnp.float32, jnp.bfloat16)),
    MKL: Library("MKL", Path(__file__).with_name("mkl_gemm.cc"), MKL_TARGET, "JaxpagedMklSgemm",
                 "JaxpagedMklProbe", (jnp.float32,)),
}


def available(library: str = ONEDNN, dtype=jnp.float32) -> bool:
    """Whether `library`'s GEMM (one of `LIBRARIES`) is built (or can be) and registered with XLA on this machine,
    and runs products in `dtype` on this CPU."""
    return _registered(library) is not None and _runs(library, jnp.dtype(dtype).name)


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


def _kernel(library: str) -> cpu_kernels.KernelSource:
    """`library`'s kernel build description, against its wheels' headers and library.

    DT_RPATH, not RUNPATH: it also finds the library's own dependencies (TBB, the SYCL runtime, MKL's
    per-CPU and threading libraries) beside it.
    """
    if library == ONEDNN:
        include_dir = _wheel_file("onednn-devel", "oneapi/dnnl/dnnl.hpp").parents[2]
        library_dir, link = _wheel_file("onednn", "libdnnl.so").parent, "-ldnnl"
    else:
        include_dir = _wheel_file("mkl-include", "include/mkl_cblas.h").parent
        runtime = _wheel_file("mkl", "libmkl_rt.so.3")  # the wheel ships no unversioned link
        library_dir, link = runtime.parent, f"-l:{runtime.name}"
    return cpu_kernels.KernelSource(LIBRARIES[library].source, f"{library}_gemm", include_dirs=(str(include_dir),),
                                    link_args=(f"-L{library_dir}", link,
                                               f"-Wl,--disable-new-dtags,-rpath,{library_dir}"),
                                    headers=(SHAPE_HEADER,))


def _prepare(library: str, kernel: cpu_kernels.KernelSource) -> None:
    """What `library` needs in the process before its first call (see the module docstring)."""
    if library == ONEDNN:
        opencl_cpu = Path(kernel.link_args[0][2:]) / "libintelocl.so"
        if opencl_cpu.exists():
            os.environ.setdefault("OCL_ICD_FILENAMES", str(opencl_cpu))
        return
    os.environ.setdefault("KMP_BLOCKTIME", "0")  # read when OpenMP starts, at MKL's first threaded call
    if MKL_THREADING == 0:
        ctypes.CDLL(str(_wheel_file("intel-openmp", "libiomp5.so")), mode=ctypes.RTLD_GLOBAL)


@functools.cache
def _registered(library: str = ONEDNN) -> Path | None:
    """Build `library`'s kernel if needed, check the library runs here, register its FFI target; None if it
    cannot be."""
    spec = LIBRARIES[library]
    try:
        kernel = _kernel(library)
        built = cpu_kernels.build(kernel)
        _prepare(library, kernel)
    except (OSError, subprocess.CalledProcessError) as err:
        log.warning("%s GEMM not built (%s); XLA's dot is used", spec.name, err)
        return None
    handle = ctypes.cdll.LoadLibrary(str(built))
    if library == MKL:
        handle.MKL_Set_Threading_Layer(MKL_THREADING)  # before MKL's first call
    if not getattr(handle, spec.probe)(0):
        log.warning("%s cannot run here (OCL_ICD_FILENAMES=%s); XLA's dot is used", spec.name,
                    os.environ.get("OCL_ICD_FILENAMES"))
        return None
    cpu_kernels.register(built, spec.symbol, spec.target)
    return built


@functools.cache
def _runs(library: str, dtype: str) -> bool:
    """Whether `library`'s registered GEMM runs products in `dtype` on this CPU (one warning when it does not)."""
    spec = LIBRARIES[library]
    if jnp.dtype(dtype) not in spec.dtypes:
        return False
    if getattr(ctypes.cdll.LoadLibrary(str(_registered(library))), spec.probe)(int(dtype == "bfloat16")):
        return True
    log.warning("%s has no %s GEMM on this CPU; XLA's dot is used", spec.name, dtype)
    return False


def gemm(x: Float[Array, "... K"], w: Float[Array, "K N"], *, transpose_w: bool = False,
         library: str = ONEDNN) -> Float[Array, "... N"]:
    """`x @ w` through `library` (`x @ w.T` with `transpose_w`, w then `[N, K]`); x's leading axes are kept.

    x and w must share a dtype that `library` takes (oneDNN: float32 or bfloat16; MKL: float32); the result
    has it too. `available(library)` must be True.
    """
    spec = LIBRARIES[library]
    if _registered(library) is None:
        raise RuntimeError(f"the {spec.name} GEMM is not available on this machine (see the warning logged)")
    if x.dtype != w.dtype or x.dtype not in spec.dtypes:
        names = " or ".join(jnp.dtype(d).name for d in spec.dtypes)
        raise ValueError(f"{spec.name}'s gemm takes {names} x and w of one dtype, got {x.dtype} and {w.dtype}")
    n = w.shape[0] if transpose_w else w.shape[1]
    rows = x.reshape(-1, x.shape[-1])
    call = jax.ffi.ffi_call(spec.target, jax.ShapeDtypeStruct((rows.shape[0], n), x.dtype))
    return call(rows, w, transpose_w=transpose_w).reshape(*x.shape[:-1], n)


@dataclasses.dataclass(frozen=True)
class GemmRoute:
    """Which weight GEMMs `library` takes: per weight dtype, the row counts `(fewest, most)` it runs; the LM
    head's product too unless `head` is False."""

    rows: tuple[tuple[str, int, int], ...]
    library: str = ONEDNN
    head: bool = True

    def takes(self, dtype, num_rows: int, *, head: bool = False) -> bool:
        """Whether a `num_rows`-row product with weights in `dtype` (the LM head's with `head`) goes to
        `library`."""
        name = jnp.dtype(dtype).name
        return ((self.head or not head) and jnp.dtype(dtype) in LIBRARIES[self.library].dtypes
                and any(name == d and fewest <= num_rows <= most for d, fewest, most in self.rows))


def dot_general(route: GemmRoute, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                out_sharding=None, *, head: bool = False):
    """`jax.lax.dot_general` for a weight product (the LM head's with `head`), through `route.library` where
    `route` takes it.

    A weight product contracts the activations' last axis with a 2-D weight's
    axis 0 (nnx.Linear's `[K, N]` kernel) or axis 1 (a tied embedding's
    `[N, K]`), without batch axes, in one dtype; anything else, and any product
    `route` does not take, is XLA's.
    """
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    weight_product = (rhs.ndim == 2 and not lhs_batch and not rhs_batch and tuple(lhs_contract) == (lhs.ndim - 1,)
                      and len(rhs_contract) == 1 and lhs.dtype == rhs.dtype
                      and preferred_element_type in (None, lhs.dtype))
    num_rows = math.prod(lhs.shape[:-1])
    if weight_product and route.takes(rhs.dtype, num_rows, head=head):
        return gemm(lhs, rhs, transpose_w=tuple(rhs_contract) == (1,), library=route.library)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type, out_sharding=out_sharding)


def route_model(model: DecoderModel, route: GemmRoute) -> DecoderModel:
    """A copy of `model` (sharing its arrays) whose projections and LM head run their products through `dot_general`
    with `route`; `model` itself is unchanged."""
    routed = nnx.merge(*nnx.split(model))
    head_dot = functools.partial(dot_general, route, head=True)
    for _, module in nnx.iter_graph(routed):
        if isinstance(module, nnx.Linear):
            module.dot_general = head_dot if module is routed.lm_head else functools.partial(dot_general, route)
    routed.tied_head_dot_general = head_dot
    return routed
