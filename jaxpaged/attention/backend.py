"""Dispatch one layer's paged attention to a backend, per group (decode, prefill)."""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

from jaxpaged.attention import cpu_attention
from jaxpaged.attention.batch import AttentionBatch, StepLayout
from jaxpaged.kv_pool.pool import write_layer_kv
from pallas_kernels.chunked_xla import chunked_paged_attention
from pallas_kernels.reference import ragged_paged_attention_reference

BACKENDS = ("auto", "cpu", "xla", "xla_reference", "pallas", "pallas_mosaic")


@dataclasses.dataclass(frozen=True)
class AttentionBackend:
    """Which attention implementation a step uses (hashable: it is a static jit argument).

    `cpu` runs every row (decode rows and prefill chunks, in one call) through a C++
    kernel called over the XLA FFI, which reads the K/V blocks in place
    (jaxpaged/attention/cpu_attention.py);
    `xla` is the chunked online-softmax attention in plain XLA;
    `xla_reference` is the pure-JAX reference it is tested against (it gathers
    every sequence's whole context: slow on long contexts, kept for comparisons);
    `pallas` is the GPU kernel on Pallas' Triton backend, which `interpret=True` runs
    through the Pallas interpreter on any device (slow; tests); `pallas_mosaic` is
    the Hopper kernel on Pallas' Mosaic GPU backend (`interpret=True`: Mosaic GPU
    interpret mode, race detector on), which hands the shapes it does not take
    (float32 queries, head_dim other than 64 or 128, more than 64 query heads per
    KV head) to the Triton kernel.
    With a `mesh` (tensor parallelism), each layer's K/V write and attention run
    under `shard_map` over its `tp` axis: every device writes and attends over its
    own KV heads and their query heads, so the kernel sees local heads only.
    `kv_chunk` / `query_tile` override the `xla` path's chunking (None: chosen per
    step shape by `choose_chunking`; tests set small ones to cross chunk edges).
    """

    name: str = "xla"
    interpret: bool = False
    mesh: Mesh | None = None
    kv_chunk: int | None = None
    query_tile: int | None = None


def resolve_backend(name: str = "auto", *, interpret: bool = False) -> AttentionBackend:
    """Pick a backend. `auto` means `$JAXPAGED_ATTENTION_BACKEND` when set (as vLLM's
    `VLLM_ATTENTION_BACKEND`), else pallas_mosaic on Hopper-class GPUs (compute
    capability 9.x), pallas (Triton) on other GPUs, and elsewhere cpu where its kernel
    builds (a C++ compiler is on PATH), else xla."""
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        name = os.environ.get(BACKEND_ENV) or (_gpu_default() if jax.default_backend() == "gpu" else _cpu_default())
        if name not in BACKENDS[1:]:
            raise ValueError(f"${BACKEND_ENV} must be one of {BACKENDS[1:]}, got {name!r}")
    if name in ("pallas", "pallas_mosaic") and not interpret and jax.default_backend() != "gpu":
        raise ValueError(f"attention_backend={name!r} needs a GPU; pass interpret=True to run it on CPU")
    if name == "cpu" and (jax.default_backend() != "cpu" or not cpu_attention.available()):
        raise ValueError("attention_backend='cpu' needs the CPU platform and a C++ compiler to build its kernel "
                         "(jaxpaged/attention/cpu_attention.py); use 'xla'")
    if name == "pallas_mosaic" and not mosaic_gpu_available():
        raise ValueError(f"attention_backend='pallas_mosaic' needs jax.experimental.pallas.mosaic_gpu "
                         f"(JAX {jax.__version__} lacks it)")
    return AttentionBackend(name, interpret)


BACKEND_ENV = "JAXPAGED_ATTENTION_BACKEND"


def mosaic_gpu_available() -> bool:
    """Whether this JAX has Pallas' Mosaic GPU backend (0.11.2 and 0.12 do; the kernel's
    interpret-mode tests and sm_90 lowering pass on both)."""
    from pallas_kernels import ragged_paged_attention_mgpu as mgpu

    return mgpu.plgpu is not None


def _cpu_default() -> str:
    """cpu where its kernel builds, else xla (warned once by cpu_attention)."""
    return "cpu" if cpu_attention.available() else "xla"


def _gpu_default() -> str:
    """pallas_mosaic on compute capability 9.x (H100/H200) when available, else pallas."""
    device = jax.devices()[0]
    capability = str(device.compute_capability) if device.platform == "gpu" else ""  # CUDA devices have one
    return "pallas_mosaic" if capability.startswith("9.") and mosaic_gpu_available() else "pallas"


def paged_attention(
    q: Float[Array, "T Hq D"],
    k_pages: Float[Array, "Hkv N B D"],
    v_pages: Float[Array, "Hkv N B D"],
    batch: AttentionBatch,
    layout: StepLayout,
    k_scale: Float[Array, "Hkv"],
    v_scale: Float[Array, "Hkv"],
    backend: AttentionBackend,
    sliding_window: int | None = None,
    sm_scale: float | None = None,
    soft_cap: float | None = None,
) -> Float[Array, "T Hq D"]:
    """Attention for every row of a step: decode group and prefill group, each in one call (`cpu`: one for both).

    `sliding_window` (static) limits each query to its last W keys (None: full attention).
    `sm_scale` (static) multiplies the scores: the model's own (Gemma's
    `query_pre_attn_scalar ** -0.5`); None means `head_dim ** -0.5`.
    `soft_cap` (static) caps the scaled scores at `c * tanh(s / c)` (None: no cap).
    """
    kernel = _kernel(backend)
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else float(sm_scale)
    options = {"k_scale": k_scale, "v_scale": v_scale} if k_pages.dtype == jnp.float8_e4m3fn else {}
    if sliding_window is not None:
        options["sliding_window"] = sliding_window
    if soft_cap is not None:
        options["soft_cap"] = float(soft_cap)
    if backend.name == "cpu":  # one call: the kernel takes decode rows and prefill chunks alike
        return kernel(q, k_pages, v_pages, batch.block_tables, batch.context_lens, batch.query_start,
                      batch.query_lens, max_query_len=max(layout.max_prefill_query_len, 1),
                      sm_scale=sm_scale, **options)
    n_dec = layout.num_decode_seqs
    outputs = []
    if n_dec:
        outputs.append(kernel(
            q[:n_dec], k_pages, v_pages, batch.block_tables[:n_dec], batch.context_lens[:n_dec],
            batch.query_start[:n_dec], batch.query_lens[:n_dec],
            max_query_len=1, sm_scale=sm_scale, **options))
    if n_dec < batch.block_tables.shape[0]:
        outputs.append(kernel(
            q[n_dec:], k_pages, v_pages, batch.block_tables[n_dec:], batch.context_lens[n_dec:],
            batch.query_start[n_dec:] - n_dec, batch.query_lens[n_dec:],
            max_query_len=max(layout.max_prefill_query_len, 1), sm_scale=sm_scale, **options))
    return outputs[0] if len(outputs) == 1 else jnp.concatenate(outputs, axis=0)


def write_and_attend(
    q: Float[Array, "T Hq D"],
    k: Float[Array, "T Hkv D"],
    v: Float[Array, "T Hkv D"],
    k_pages: Float[Array, "Hkv N B D"],
    v_pages: Float[Array, "Hkv N B D"],
    k_scale: Float[Array, "Hkv"],
    v_scale: Float[Array, "Hkv"],
    batch: AttentionBatch,
    layout: StepLayout,
    backend: AttentionBackend,
    sliding_window: int | None = None,
    sm_scale: float | None = None,
    soft_cap: float | None = None,
) -> tuple[Float[Array, "T Hq D"], Array, Array]:
    """Scatter this step's K/V into one layer's pages, then attend; returns (output, k_pages', v_pages').

    `sliding_window` is the layer's window (static; None for full attention);
    `sm_scale` the softmax scale (static; None for `head_dim ** -0.5`);
    `soft_cap` the attention logit soft cap (static; None for none).

    Under a mesh the heads axis of q, k, v, the pages and the scales is split
    over the mesh's one axis (`tp`) and the batch metadata is replicated; nothing crosses devices.
    """

    def local(q, k, v, k_pages, v_pages, k_scale, v_scale, batch):
        k_pages, v_pages = write_layer_kv(k_pages, v_pages, k, v, batch.slot_mapping, k_scale, v_scale)
        out = paged_attention(q, k_pages, v_pages, batch, layout, k_scale, v_scale, backend, sliding_window,
                              sm_scale, soft_cap)
        return out, k_pages, v_pages

    if backend.mesh is None:
        return local(q, k, v, k_pages, v_pages, k_scale, v_scale, batch)
    (axis,) = backend.mesh.axis_names  # the tensor-parallel mesh has one axis (`jaxpaged.parallel`: "tp")
    heads, pages, scale = P(None, axis, None), P(axis), P(axis)
    replicated = AttentionBatch(*(P() for _ in AttentionBatch._fields))
    sharded = jax.shard_map(local, mesh=backend.mesh,
                            in_specs=(heads, heads, heads, pages, pages, scale, scale, replicated),
                            out_specs=(heads, pages, pages), check_vma=False)
    return sharded(q, k, v, k_pages, v_pages, k_scale, v_scale, batch)


def _kernel(backend: AttentionBackend):
    if backend.name == "cpu":
        return cpu_attention.cpu_paged_attention
    if backend.name == "xla":
        return functools.partial(chunked_paged_attention, kv_chunk=backend.kv_chunk, query_tile=backend.query_tile)
    if backend.name == "xla_reference":
        return ragged_paged_attention_reference
    if backend.name == "pallas":
        from pallas_kernels.ragged_paged_attention import ragged_paged_attention

        def pallas(*args, **kwargs):
            return ragged_paged_attention(*args, interpret=backend.interpret, **kwargs)

        return pallas
    if backend.name == "pallas_mosaic":
        return functools.partial(_mosaic_or_triton, interpret=backend.interpret)
    raise ValueError(f"unknown attention backend {backend.name!r}")


def _mosaic_or_triton(q, k_pages, *args, interpret: bool, **kwargs):
    """The Mosaic GPU kernel where it applies to these shapes, else the Triton kernel."""
    from pallas_kernels import ragged_paged_attention_mgpu as mgpu

    if mgpu.supports(q.dtype, k_pages.dtype, q.shape[-1], q.shape[1] // k_pages.shape[0]):
        return mgpu.ragged_paged_attention_mgpu(
            q, k_pages, *args, interpret=mgpu.interpret_params() if interpret else None, **kwargs)
    from pallas_kernels.ragged_paged_attention import ragged_paged_attention

    return ragged_paged_attention(q, k_pages, *args, interpret=interpret, **kwargs)
