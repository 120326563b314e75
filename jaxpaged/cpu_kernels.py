"""C++ kernels for XLA:CPU: compiled once per machine with the system compiler, registered as FFI targets.

A kernel is one C++ source file next to the Python module that calls it
(`attention/cpu_attention.cc`, `model/cpu_gemm.cc`). `build` compiles it on
first use against the XLA FFI headers jaxlib ships (plus any library the
kernel names), into the per-user cache (`$JAXPAGED_CPU_KERNEL_DIR`, else
`~/.cache/jaxpaged/cpu-kernels`), keyed by the source, the flags, the jaxlib
version and the CPU's instruction-set flags; `register` loads the library and
registers its handler with XLA. Custom calls registered this way can be
written to the persistent compile cache, unlike XLA's own oneDNN rewrites.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jax
import jaxlib

CACHE_ENV = "JAXPAGED_CPU_KERNEL_DIR"
# -ffast-math lets the compiler vectorise exp; it is given to the compile step only, because linking
# with it adds crtfastmath.o, which would turn on flush-to-zero for the whole process.
COMPILE_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp-simd", "-std=c++17", "-fPIC")
LINK_FLAGS = ("-shared",)


@dataclass(frozen=True)
class KernelSource:
    """One kernel: its C++ file, the stem of its built library, and what else it compiles and links with."""

    source: Path
    name: str
    include_dirs: tuple[str, ...] = ()
    link_args: tuple[str, ...] = ()


def build(kernel: KernelSource) -> Path:
    """The compiled kernel's path, compiling it into the cache first when it is not there.

    Raises OSError when no C++ compiler is found, CalledProcessError when compiling or linking fails.
    """
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise OSError("no C++ compiler (c++, g++ or clang++) on PATH")
    includes = [arg for directory in (jax.ffi.include_dir(), *kernel.include_dirs) for arg in ("-I", directory)]
    library = cache_dir() / f"{kernel.name}-{_build_key(kernel, compiler, includes)}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name and renamed: parallel test workers may build at once.
    with tempfile.NamedTemporaryFile(dir=library.parent, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        obj = partial.with_suffix(".o")
        subprocess.run([compiler, *COMPILE_FLAGS, *includes, "-c", str(kernel.source), "-o", str(obj)],
                       check=True, capture_output=True, text=True)
        subprocess.run([compiler, *LINK_FLAGS, str(obj), *kernel.link_args, "-o", str(partial)], check=True,
                       capture_output=True, text=True)
        os.replace(partial, library)
    finally:
        partial.unlink(missing_ok=True)
        partial.with_suffix(".o").unlink(missing_ok=True)
    return library


def register(library: Path, symbol: str, target: str) -> None:
    """Load `library` and register its FFI handler `symbol` with XLA:CPU as the custom call `target`."""
    handle = ctypes.cdll.LoadLibrary(str(library))
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(handle, symbol)), platform="cpu")


def cache_dir() -> Path:
    """Where built kernels are kept: `$JAXPAGED_CPU_KERNEL_DIR`, else the user's cache directory."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jaxpaged" / "cpu-kernels"


def _build_key(kernel: KernelSource, compiler: str, includes: list[str]) -> str:
    """A digest of what the binary depends on: source, flags, compiler, jaxlib and the CPU's features."""
    digest = hashlib.sha256(kernel.source.read_bytes())
    digest.update(" ".join((compiler, *COMPILE_FLAGS, *includes, *LINK_FLAGS, *kernel.link_args,
                            jaxlib.__version__, platform.machine(), _cpu_flags())).encode())
    return digest.hexdigest()[:16]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()
