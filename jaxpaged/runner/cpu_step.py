"""The step's settings on XLA:CPU: which dot path it compiles with, who runs the weight GEMMs, and the fewest
decode rows it pads to.

Both are chosen by platform and weight dtype from measurements of the whole
step (docs/benchmarks/cpu-performance.md); on any other platform the step
compiles and pads exactly as before (the GPU path and its Mosaic / Pallas
kernels are untouched).

**Compile options.** `jax.jit(..., compiler_options=...)` hands XLA debug
options to one executable, so an engine can pick XLA:CPU's dot path without
`XLA_FLAGS` (read once, process-wide, when JAX's backend starts). This
jaxlib's default already runs dots through YNNPACK fusions
(`xla_cpu_experimental_ynn_fusion_type`); the other library paths (oneDNN,
XNNPACK) only take a dot once YNNPACK's fusions are off. The presets:

- ``"eigen"``: YNNPACK's fusions off, XLA's own dot emitter (Eigen);
- ``"ynn_eltwise"``: YNNPACK also fuses the elementwise work around a dot.

oneDNN (YNNPACK's fusions off, `xla_cpu_use_onednn` and
`xla_cpu_experimental_onednn_custom_call`) was measured and is not a preset:
with it on every step, an engine test's step crashed XLA:CPU (a segmentation
fault in `tests/engine/test_engine_parity.py`), and this jaxlib cannot
serialise its executables for the persistent compile cache (`std::bad_alloc`).

`EngineConfig.cpu_compiler_options` picks one for every step, ``"off"``
(jaxlib's default path for every step) or ``"auto"``: `AUTO_PRESETS`, per
dtype and only for steps of at most so many tokens, where a preset made the
whole step faster and can be kept. None is set today: the presets were
slower on the whole step, and oneDNN, which made a float32 one-token step
0.65x as long (it takes the tied LM head's matrix-vector product, which XLA
runs as a plain loop), was 3-7% slower at 64 rows, 1.1-1.2x slower in
bfloat16, not cacheable and not safe (above). The options are part of the cache's key (JAX hashes them with
the module), so steps compiled with and without them never share an entry.

**Weight GEMMs.** `EngineConfig.cpu_gemm` sends the model's projections and
LM head to a oneDNN matmul called through the XLA FFI (`jaxpaged.model.cpu_gemm`)
instead of XLA's dot: ``"onednn"`` every product, ``"xla"`` none, ``"auto"``
those `AUTO_GEMM_ROWS` lists (by weight dtype and the product's row count).
Measured on the whole step (docs/benchmarks/cpu-performance.md, "oneDNN GEMMs
over the XLA FFI"): in bfloat16 a decode step of 2-32 rows took 0.45-0.88x as
long with oneDNN (XLA:CPU's small bf16 dots are slow), 64 rows 0.95-0.99x, a
512-token prefill 1.4-1.6x; in float32 no step was consistently faster
(0.94-1.16x). So ``"auto"`` routes bfloat16 products of at most 32 rows, which
includes a prefill's LM-head rows. Only with one device: the custom call does
not partition over a mesh.

**Decode rows.** XLA:CPU lowers a one-row dot to a matrix-vector product
outside YNNPACK: in bfloat16 it converts the whole weight matrix to float32
on every call (SmolLM2's weight GEMMs took 224 ms at one row against 87 ms at
two), and in float32 the tied LM head's product runs as a plain loop. A CPU
step therefore pads its decode rows to at least two (`min_decode_rows`); the
padding row is masked like any other padding.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp

from jaxpaged.model import cpu_gemm

AUTO = "auto"
OFF = "off"
_YNN_FUSIONS = "xla_cpu_experimental_ynn_fusion_type"
PRESETS: dict[str, dict[str, object]] = {
    "eigen": {_YNN_FUSIONS: ""},
    "ynn_eltwise": {_YNN_FUSIONS: "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE"},
}
CHOICES = (AUTO, OFF, *PRESETS)
# what "auto" sets, by weight dtype: (preset, on steps of at most this many tokens); a dtype not listed keeps
# jaxlib's default. Empty: no preset was both faster and cacheable (the module docstring)
AUTO_PRESETS: dict[str, tuple[str, int]] = {}
GEMM_XLA, GEMM_ONEDNN = "xla", "onednn"
GEMM_CHOICES = (AUTO, GEMM_XLA, GEMM_ONEDNN)
EVERY_ROW = (("float32", 1, 1 << 62), ("bfloat16", 1, 1 << 62))
# what "auto" sends to oneDNN: (weight dtype, fewest rows, most rows) of a product where the whole step was
# measured faster with it (docs/benchmarks/cpu-performance.md); a product outside every range stays XLA's
AUTO_GEMM_ROWS: tuple[tuple[str, int, int], ...] = (("bfloat16", 1, 32),)
# the fewest decode rows of a CPU step, by weight dtype: a one-row dot is XLA:CPU's slow path
MIN_DECODE_ROWS: dict[str, int] = {"bfloat16": 2, "float32": 2}


def check_setting(setting: str) -> None:
    """ValueError unless `setting` is one of `CHOICES`."""
    if setting not in CHOICES:
        raise ValueError(f"cpu_compiler_options must be one of {CHOICES}, got {setting!r}")


def step_compiler_options(setting: str, platform: str, dtype, num_tokens: int) -> dict[str, object]:
    """The XLA compile options of a step of `num_tokens` (padded) tokens for `setting` (one of `CHOICES`), on
    `platform` with weights in `dtype`.

    Empty off the CPU platform, for ``"off"``, and for ``"auto"`` where no
    preset was measured faster (that dtype, or a step of that size).
    """
    check_setting(setting)
    if platform != "cpu" or setting == OFF:
        return {}
    if setting != AUTO:
        return dict(PRESETS[setting])
    name, max_tokens = AUTO_PRESETS.get(jnp.dtype(dtype).name, (None, 0))
    return dict(PRESETS[name]) if name and num_tokens <= max_tokens else {}


def check_gemm_setting(setting: str) -> None:
    """ValueError unless `setting` is one of `GEMM_CHOICES`."""
    if setting not in GEMM_CHOICES:
        raise ValueError(f"cpu_gemm must be one of {GEMM_CHOICES}, got {setting!r}")


def gemm_route(setting: str, platform: str, dtype, tensor_parallel_size: int = 1) -> cpu_gemm.GemmRoute | None:
    """Which weight GEMMs of a model with weights in `dtype` go to oneDNN for `setting` (one of `GEMM_CHOICES`);
    None: all are XLA's.

    None off the CPU platform, with tensor parallelism (the custom call does not partition), for ``"xla"``,
    where the setting routes no product of this dtype (oneDNN is then not even loaded), and where the oneDNN
    GEMM is not available in this dtype (`cpu_gemm.available(dtype)` logs why, once; no bfloat16 matmul on an
    AVX2-only CPU).
    """
    check_gemm_setting(setting)
    if platform != "cpu" or tensor_parallel_size > 1 or setting == GEMM_XLA:
        return None
    name = jnp.dtype(dtype).name
    rows = tuple(entry for entry in (EVERY_ROW if setting == GEMM_ONEDNN else AUTO_GEMM_ROWS) if entry[0] == name)
    if not rows or not cpu_gemm.available(dtype):
        return None
    return cpu_gemm.GemmRoute(rows=rows)


def min_decode_rows(platform: str, dtype) -> int:
    """The fewest decode rows a step of weights in `dtype` pads to on `platform` (1: no extra padding)."""
    if platform != "cpu":
        return 1
    return MIN_DECODE_ROWS.get(jnp.dtype(dtype).name, 1)


def describe(options: Mapping[str, object]) -> str:
    """`options` as XLA_FLAGS-style text, for logs (``"(none)"`` when empty)."""
    return " ".join(f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items()) or "(none)"
