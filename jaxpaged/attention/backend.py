"""Dispatch one layer's paged attention to a backend, per group (decode, prefill)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxpaged.attention.batch import AttentionBatch, StepLayout
from pallas_kernels.reference import ragged_paged_attention_reference

BACKENDS = ("auto", "xla", "pallas")


@dataclasses.dataclass(frozen=True)
class AttentionBackend:
    """Which attention implementation a step uses (hashable: it is a static jit argument).

    `xla` is the pure-JAX reference; `pallas` is the GPU kernel, which
    `interpret=True` runs through the Pallas interpreter on any device (slow; tests).
    """

    name: str = "xla"
    interpret: bool = False


def resolve_backend(name: str = "auto", *, interpret: bool = False) -> AttentionBackend:
    """Pick a backend: `auto` means pallas on GPU, xla elsewhere."""
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        name = "pallas" if jax.default_backend() == "gpu" else "xla"
    if name == "pallas" and not interpret and jax.default_backend() != "gpu":
        raise ValueError("attention_backend='pallas' needs a GPU; pass interpret=True to run it on CPU")
    return AttentionBackend(name, interpret)


def paged_attention(
    q: Float[Array, "T Hq D"],
    k_pages: Float[Array, "Hkv N B D"],
    v_pages: Float[Array, "Hkv N B D"],
    batch: AttentionBatch,
    layout: StepLayout,
    k_scale: Float[Array, "Hkv"],
    v_scale: Float[Array, "Hkv"],
    backend: AttentionBackend,
) -> Float[Array, "T Hq D"]:
    """Attention for every row of a step: decode group and prefill group, each in one call."""
    kernel = _kernel(backend)
    sm_scale = q.shape[-1] ** -0.5
    scales = {"k_scale": k_scale, "v_scale": v_scale} if k_pages.dtype == jnp.float8_e4m3fn else {}
    n_dec = layout.num_decode_seqs
    outputs = []
    if n_dec:
        outputs.append(kernel(
            q[:n_dec], k_pages, v_pages, batch.block_tables[:n_dec], batch.context_lens[:n_dec],
            batch.query_start[:n_dec], batch.query_lens[:n_dec],
            max_query_len=1, sm_scale=sm_scale, **scales))
    if n_dec < batch.block_tables.shape[0]:
        outputs.append(kernel(
            q[n_dec:], k_pages, v_pages, batch.block_tables[n_dec:], batch.context_lens[n_dec:],
            batch.query_start[n_dec:] - n_dec, batch.query_lens[n_dec:],
            max_query_len=max(layout.max_prefill_query_len, 1), sm_scale=sm_scale, **scales))
    return outputs[0] if len(outputs) == 1 else jnp.concatenate(outputs, axis=0)


def _kernel(backend: AttentionBackend):
    if backend.name == "xla":
        return ragged_paged_attention_reference
    if backend.name == "pallas":
        from pallas_kernels.ragged_paged_attention import ragged_paged_attention

        def pallas(*args, **kwargs):
            return ragged_paged_attention(*args, interpret=backend.interpret, **kwargs)

        return pallas
    raise ValueError(f"unknown attention backend {backend.name!r}")
