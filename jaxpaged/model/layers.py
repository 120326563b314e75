"""Decoder building blocks: RMSNorm, gated MLP, grouped-query attention over the paged pool.

One set of modules for every family; the config's fields switch on what a
family adds (q/k/v biases, q/k norms, Gemma's `(1 + w)` norms and four norms
per layer, GeGLU, a softmax scale from `query_pre_attn_scalar`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from jaxpaged.attention import AttentionBackend, AttentionBatch, StepLayout, write_and_attend
from jaxpaged.config import ModelConfig
from jaxpaged.model.rope import apply_rope
from pallas_kernels.reference import soft_capped


class RMSNorm(nnx.Module):
    """Root-mean-square norm, computed in float32; scales by `w`, or by `1 + w` with `unit_offset` (Gemma)."""

    def __init__(self, dim: int, eps: float, dtype, unit_offset: bool = False):
        # Gemma stores w - 1, so its identity norm is all zeros
        self.weight = nnx.Param((jnp.zeros if unit_offset else jnp.ones)((dim,), dtype))
        self.eps = eps
        self.unit_offset = unit_offset

    def __call__(self, x: Float[Array, "... H"]) -> Float[Array, "... H"]:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * (self.unit_offset + self.weight[...].astype(jnp.float32))).astype(x.dtype)


def rms_norm(config: ModelConfig, dim: int, dtype) -> RMSNorm:
    """An RMSNorm over `dim` in the config's flavour (eps, Gemma's unit offset)."""
    return RMSNorm(dim, config.rms_norm_eps, dtype, config.norm_unit_offset)


def _linear(in_dim: int, out_dim: int, dtype, rngs: nnx.Rngs, bias: bool = False) -> nnx.Linear:
    init = nnx.initializers.normal(stddev=in_dim ** -0.5)
    return nnx.Linear(in_dim, out_dim, use_bias=bias, dtype=dtype, param_dtype=dtype,
                      kernel_init=init, rngs=rngs)


def _side_by_side(parts: list[nnx.Linear]) -> nnx.Linear:
    """One Linear whose output is the outputs of `parts` concatenated: one dot where there were several."""
    first = parts[0]
    kernel = jnp.concatenate([p.kernel[...] for p in parts], axis=-1)
    bias = None if first.bias is None else jnp.concatenate([p.bias[...] for p in parts], axis=-1)
    return nnx.Linear(kernel.shape[0], kernel.shape[1], use_bias=bias is not None, dtype=first.dtype,
                      param_dtype=kernel.dtype, kernel_init=lambda *_: kernel,
                      bias_init=lambda *_: bias, rngs=nnx.Rngs(0))


ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
}


class MLP(nnx.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x)); SwiGLU with silu, GeGLU with gelu."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        self.gate_proj = _linear(config.hidden_size, config.intermediate_size, dtype, rngs)
        self.up_proj = _linear(config.hidden_size, config.intermediate_size, dtype, rngs)
        self.down_proj = _linear(config.intermediate_size, config.hidden_size, dtype, rngs)
        self.act = ACTIVATIONS[config.hidden_act]
        self.gate_up_proj = None  # set by `fuse_projections`

    def fuse_projections(self) -> None:
        """Replace gate_proj and up_proj by `gate_up_proj`, their kernels side by side (one dot, not two)."""
        self.gate_up_proj = nnx.data(_side_by_side([self.gate_proj, self.up_proj]))
        del self.gate_proj, self.up_proj

    def __call__(self, x):
        if self.gate_up_proj is None:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        gate, up = jnp.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(self.act(gate) * up)


class Attention(nnx.Module):
    """Grouped-query attention: `num_heads` query heads share `num_kv_heads` K/V heads."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs, sliding_window: int | None = None):
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, d
        self.sliding_window = sliding_window  # static: None is full attention
        self.scale = config.attn_scale  # static
        self.soft_cap = config.attn_logit_softcapping  # static: None is no cap
        self.q_proj = _linear(h, config.num_heads * d, dtype, rngs, config.qkv_bias)
        self.k_proj = _linear(h, config.num_kv_heads * d, dtype, rngs, config.qkv_bias)
        self.v_proj = _linear(h, config.num_kv_heads * d, dtype, rngs, config.qkv_bias)
        self.o_proj = _linear(config.num_heads * d, h, dtype, rngs, config.o_bias)
        self.q_norm = rms_norm(config, d, dtype) if config.qk_norm else None
        self.k_norm = rms_norm(config, d, dtype) if config.qk_norm else None
        self.qkv_proj = None  # set by `fuse_projections`

    def fuse_projections(self) -> None:
        """Replace q_proj, k_proj and v_proj by `qkv_proj`, their kernels side by side (one dot, not three)."""
        self.qkv_proj = nnx.data(_side_by_side([self.q_proj, self.k_proj, self.v_proj]))
        del self.q_proj, self.k_proj, self.v_proj

    def _project_qkv(self, x):
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return jnp.split(self.qkv_proj(x), [q_width, q_width + kv_width], axis=-1)

    def _qkv(self, x, positions, inv_freq):
        lead = x.shape[:-1]
        q, k, v = self._project_qkv(x)
        q = q.reshape(*lead, self.num_heads, self.head_dim)
        k = k.reshape(*lead, self.num_kv_heads, self.head_dim)
        v = v.reshape(*lead, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        flat_pos = positions.reshape(-1)
        q = apply_rope(q.reshape(-1, *q.shape[-2:]), flat_pos, inv_freq).reshape(q.shape)
        k = apply_rope(k.reshape(-1, *k.shape[-2:]), flat_pos, inv_freq).reshape(k.shape)
        return q, k, v

    def __call__(
        self,
        x: Float[Array, "T H"],
        positions: Int[Array, "T"],
        inv_freq: Float[Array, "D2"],
        k_pages: Array,
        v_pages: Array,
        k_scale: Float[Array, "Hkv"],
        v_scale: Float[Array, "Hkv"],
        batch: AttentionBatch,
        layout: StepLayout,
        backend: AttentionBackend,
    ) -> tuple[Float[Array, "T H"], Array, Array]:
        """Write this step's K/V into the pool, then attend through the block tables."""
        q, k, v = self._qkv(x, positions, inv_freq)
        out, k_pages, v_pages = write_and_attend(q, k, v, k_pages, v_pages, k_scale, v_scale,
                                                 batch, layout, backend, self.sliding_window, self.scale,
                                                 self.soft_cap)
        return self.o_proj(out.reshape(x.shape[0], -1)), k_pages, v_pages

    def dense(self, x: Float[Array, "B L H"], positions: Int[Array, "B L"], inv_freq) -> Float[Array, "B L H"]:
        """Causal attention over the whole sequence with no cache: the test reference."""
        q, k, v = self._qkv(x, positions, inv_freq)
        group = self.num_heads // self.num_kv_heads
        k = jnp.repeat(k, group, axis=2).astype(jnp.float32)
        v = jnp.repeat(v, group, axis=2).astype(jnp.float32)
        scores = soft_capped(jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k) * self.scale, self.soft_cap)
        length = x.shape[1]
        causal = jnp.tril(jnp.ones((length, length), bool))
        if self.sliding_window is not None:
            causal = causal & ~jnp.tril(jnp.ones((length, length), bool), -self.sliding_window)
        probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).astype(x.dtype)
        return self.o_proj(out.reshape(*x.shape[:2], -1))


class DecoderLayer(nnx.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)).

    With `sandwich_norms` (Gemma) the attention and MLP outputs are normed too
    before the residual add, with HF's names: `input_layernorm` -> attention ->
    `post_attention_layernorm`, then `pre_feedforward_layernorm` -> MLP ->
    `post_feedforward_layernorm`. Without it `post_attention_layernorm` is the
    MLP's input norm (Llama's naming).
    """

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs, layer: int = 0):
        h = config.hidden_size
        self.input_layernorm = rms_norm(config, h, dtype)
        self.self_attn = Attention(config, dtype, rngs, config.layer_window(layer))
        self.post_attention_layernorm = rms_norm(config, h, dtype)
        self.mlp = MLP(config, dtype, rngs)
        sandwich = config.sandwich_norms
        self.pre_feedforward_layernorm = rms_norm(config, h, dtype) if sandwich else None
        self.post_feedforward_layernorm = rms_norm(config, h, dtype) if sandwich else None

    def _after_attention(self, x, attn_out):
        """The attention branch's residual add, then the MLP branch's, in the config's norm layout."""
        if self.pre_feedforward_layernorm is None:
            x = x + attn_out
            return x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.post_attention_layernorm(attn_out)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))

    def __call__(self, x, positions, inv_freq, k_pages, v_pages, k_scale, v_scale, batch, layout, backend):
        attn_out, k_pages, v_pages = self.self_attn(
            self.input_layernorm(x), positions, inv_freq, k_pages, v_pages, k_scale, v_scale,
            batch, layout, backend)
        return self._after_attention(x, attn_out), k_pages, v_pages

    def dense(self, x, positions, inv_freq):
        """No-cache forward of a full batch of sequences."""
        return self._after_attention(x, self.self_attn.dense(self.input_layernorm(x), positions, inv_freq))
