"""The matmul floor of a step: its weight GEMMs alone, on the model's own weights.

A decode step of `R` rows multiplies `R x hidden` activations by every weight
matrix once (q, k, v, o, gate, up, down in each layer, then the LM head). Timing
exactly those products, chained as the model chains them (with the residual
adds and SiLU that join them, and no attention, norms, K/V write or sampling), gives the time the step
could not go below at the FLOP/s this machine reaches for those shapes. A step
within 2x of its floor spends at most as long on everything else as on the
matmuls.

`torch_gemm_flops_per_second` times the same chain through torch, whose CPU
GEMMs are oneDNN's, as vLLM's CPU build runs them: the floor of an engine
with oneDNN's GEMMs, beside XLA's.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from jaxpaged.bench.offline.timing import median_seconds
from jaxpaged.model import DecoderModel


def model_weight_matrices(model: DecoderModel) -> list[list[Array]]:
    """Each layer's `[in, out]` weight matrices in call order, then `[[lm_head]]`."""
    layers = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append([m.kernel[...] for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                               mlp.gate_proj, mlp.up_proj, mlp.down_proj)])
    head = model.embed_tokens.embedding[...].T if model.lm_head is None else model.lm_head.kernel[...]
    return layers + [[head]]


def _weight_gemms(x: Float[Array, "R H"], layers: list[list[Array]], silu=jax.nn.silu) -> Float[Array, "R V"]:
    """The step's GEMMs in the model's order; each result feeds the next so none is dropped. In torch too, with
    torch tensors and torch's `silu`."""
    for q, k, v, o, gate, up, down in layers[:-1]:
        attn = x @ q
        kv = (x @ k).sum() + (x @ v).sum()  # K/V feed the cache, not the residual: keep them live
        x = x + attn @ o + kv * 1e-30
        x = x + (silu(x @ gate) * (x @ up)) @ down
    return x @ layers[-1][0]


def matmul_flops(model: DecoderModel, rows: int) -> int:
    """FLOPs of the weight GEMMs for `rows` rows (2 per multiply-add)."""
    return rows * sum(weight_flops_per_row(model))


def weight_flops_per_row(model: DecoderModel) -> tuple[int, int]:
    """(decoder layers' weight-GEMM FLOPs, LM head FLOPs) for one row: a token through the stack, a row of logits."""
    *layers, head = model_weight_matrices(model)
    layer_flops = 2 * sum(int(np.prod(w.shape)) for layer in layers for w in layer)
    return layer_flops, 2 * int(np.prod(head[0].shape))


def gemm_flops_per_second(model: DecoderModel, rows: int, repeats: int = 5) -> float:
    """The FLOP/s this machine reaches on the model's own weight GEMMs at `rows` rows (median of `repeats`)."""
    return matmul_flops(model, rows) / time_matmul_floor(model, rows, repeats)


def floor_input(model: DecoderModel, rows: int) -> Array:
    """The `[rows, hidden]` activations a floor is timed on, in the weights' dtype (fixed seed)."""
    dtype = model.layers[0].mlp.gate_proj.kernel[...].dtype
    return jnp.asarray(np.random.default_rng(0).normal(size=(rows, model.config.hidden_size)) * 0.02, dtype)


def time_matmul_floor(model: DecoderModel, rows: int, repeats: int = 10) -> float:
    """Median seconds of the weight GEMMs of a `rows`-row step, after one compile-and-warm-up run."""
    layers = model_weight_matrices(model)
    x = floor_input(model, rows)
    gemms = jax.jit(_weight_gemms)
    return median_seconds(lambda: jax.block_until_ready(gemms(x, layers)), repeats)


def _to_torch(array):
    """A JAX array as a torch tensor of the same dtype (bfloat16 through its bits: numpy has no bfloat16)."""
    import torch
    host = np.asarray(array)
    if host.dtype == jnp.bfloat16:
        return torch.from_numpy(host.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(host.copy())


def _torch_weights(model: DecoderModel) -> list:
    """`model_weight_matrices` as torch tensors."""
    return [[_to_torch(w) for w in layer] for layer in model_weight_matrices(model)]


def torch_weight_gemms(model: DecoderModel, x: Array):
    """The step's weight GEMMs of `x` (`[rows, hidden]`) through torch, as a numpy float32 array."""
    import torch
    layers = _torch_weights(model)
    with torch.inference_mode():
        return _weight_gemms(_to_torch(x), layers, torch.nn.functional.silu).float().numpy()


def torch_gemm_flops_per_second(model: DecoderModel, rows: int, repeats: int = 5) -> float | None:
    """The FLOP/s torch (oneDNN, every core) reaches on the model's weight GEMMs at `rows` rows; None without torch.

    The same chain as `time_matmul_floor`, in the model's dtype, median of `repeats` after one warm-up.
    """
    try:
        import torch
    except ImportError:
        return None
    layers = _torch_weights(model)
    x = _to_torch(floor_input(model, rows))
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # every core, as vLLM's CPU build is given them here
    try:
        with torch.inference_mode():
            seconds = median_seconds(lambda: _weight_gemms(x, layers, torch.nn.functional.silu), repeats)
    finally:
        torch.set_num_threads(threads)
    return matmul_flops(model, rows) / seconds
