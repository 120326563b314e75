"""Keeps freed host memory in the process on a CPU-only JAX host, so a step's buffers do not fault in anew.

XLA:CPU allocates an executable's temporary buffer (~100 MB for a SmolLM2
decode step of 64 rows) with `malloc` on every run, from one of its worker
threads. glibc serves an allocation that large with a fresh `mmap` and
unmaps it on `free`, so every run touches zeroed pages again: ~9,300 page
faults and ~40 ms of kernel time per decode step on a 2-core VM, where a fault
costs ~5 us. Serving every thread from glibc's main arena with `mmap`
turned off and trimming only above 2 GiB (`mallopt`) keeps freed pages for
the next step, as vLLM's CPU build does by preloading tcmalloc (measured in
docs/benchmarks/cpu-performance.md, "Page faults of the step's buffers").

`mallopt` must run before XLA's threads first allocate (an arena is chosen at
a thread's first `malloc`), so `import jaxpaged` calls `configure()` before
anything initialises a JAX backend. A program that runs JAX work before
importing jaxpaged gets no effect; for it, glibc's `GLIBC_TUNABLES`
(`glibc.malloc.arena_max=1`, `glibc.malloc.mmap_max=0` and a large
`glibc.malloc.trim_threshold`, joined by colons) set before it starts does
the same.
`JAXPAGED_HOST_ALLOCATOR` picks:

- ``"auto"`` (default): keep freed memory on Linux with glibc when JAX will
  run on CPU (`JAX_PLATFORMS` names ``cpu`` first, or it is unset and no
  accelerator plugin is installed); a GPU or TPU host is left as it is;
- ``"keep"``: keep freed memory whatever the platform (Linux with glibc);
- ``"system"``: leave the C allocator as it is.

The cost: the process's resident memory stays at its peak (freed memory is
reused, not returned), and every thread shares one arena.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import platform
from collections.abc import Mapping

ENV = "JAXPAGED_HOST_ALLOCATOR"
AUTO, KEEP, SYSTEM = "auto", "keep", "system"
CHOICES = (AUTO, KEEP, SYSTEM)
# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_TRIM_ABOVE_BYTES = 2**31 - 1  # mallopt takes an int: trim only when 2 GiB sit free at the heap's top

_configured: str | None = None


def jax_will_run_on_cpu(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether JAX's default backend will be the CPU, judged without starting a backend.

    `JAX_PLATFORMS` decides when set (its first platform); otherwise the CPU is the default exactly when no
    accelerator plugin is installed (JAX's `jax_plugins` namespace package or entry points, or `libtpu`).
    """
    platforms = environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0].strip().lower() == "cpu"
    if importlib.metadata.entry_points(group="jax_plugins"):
        return False
    return importlib.util.find_spec("jax_plugins") is None and importlib.util.find_spec("libtpu") is None


def should_keep_freed_memory(setting: str, *, system: str, libc: str, on_cpu: bool) -> bool:
    """Whether `setting` (one of `CHOICES`) keeps freed memory on an OS named `system` with C library `libc`
    (as `platform.libc_ver()` names it), JAX running on CPU when `on_cpu`. ValueError for another setting."""
    if setting not in CHOICES:
        raise ValueError(f"{ENV} must be one of {CHOICES}, got {setting!r}")
    if setting == SYSTEM or system != "Linux" or libc != "glibc":
        return False
    return setting == KEEP or on_cpu


def configure(environ: Mapping[str, str] = os.environ) -> str:
    """Applies `JAXPAGED_HOST_ALLOCATOR` once per process; returns what it did (``"kept"`` or ``"system"``).

    Later calls return the first call's result and change nothing.
    """
    global _configured
    if _configured is not None:
        return _configured
    setting = environ.get(ENV, AUTO).strip().lower() or AUTO
    keep = should_keep_freed_memory(setting, system=platform.system(), libc=platform.libc_ver()[0],
                                    on_cpu=setting == AUTO and jax_will_run_on_cpu(environ))
    _configured = "kept" if keep and _keep_freed_memory() else "system"
    return _configured


def _keep_freed_memory() -> bool:
    libc = ctypes.CDLL(None)
    return all(libc.mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _TRIM_ABOVE_BYTES)))
