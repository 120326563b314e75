"""Decoder building blocks: RMSNorm, SwiGLU MLP, grouped-query attention over the paged pool."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from jaxpaged.attention import AttentionBackend, AttentionBatch, StepLayout, write_and_attend
from jaxpaged.config import ModelConfig
from jaxpaged.model.rope import apply_rope


class RMSNorm(nnx.Module):
    """Root-mean-square norm, computed in float32."""

    def __init__(self, dim: int, eps: float, dtype):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x: Float[Array, "... H"]) -> Float[Array, "... H"]:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * self.weight[...].astype(jnp.float32)).astype(x.dtype)


def _linear(in_dim: int, out_dim: int, dtype, rngs: nnx.Rngs) -> nnx.Linear:
    init = nnx.initializers.normal(stddev=in_dim ** -0.5)
    return nnx.Linear(in_dim, out_dim, use_bias=False, dtype=dtype, param_dtype=dtype,
                      kernel_init=init, rngs=rngs)


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        self.gate_proj = _linear(config.hidden_size, config.intermediate_size, dtype, rngs)
        self.up_proj = _linear(config.hidden_size, config.intermediate_size, dtype, rngs)
        self.down_proj = _linear(config.intermediate_size, config.hidden_size, dtype, rngs)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nnx.Module):
    """Grouped-query attention: `num_heads` query heads share `num_kv_heads` K/V heads."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs, sliding_window: int | None = None):
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, d
        self.sliding_window = sliding_window  # static: None is full attention
        self.q_proj = _linear(h, config.num_heads * d, dtype, rngs)
        self.k_proj = _linear(h, config.num_kv_heads * d, dtype, rngs)
        self.v_proj = _linear(h, config.num_kv_heads * d, dtype, rngs)
        self.o_proj = _linear(config.num_heads * d, h, dtype, rngs)

    def _qkv(self, x, positions, inv_freq):
        lead = x.shape[:-1]
        q = self.q_proj(x).reshape(*lead, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(*lead, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(*lead, self.num_kv_heads, self.head_dim)
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
                                                 batch, layout, backend, self.sliding_window)
        return self.o_proj(out.reshape(x.shape[0], -1)), k_pages, v_pages

    def dense(self, x: Float[Array, "B L H"], positions: Int[Array, "B L"], inv_freq) -> Float[Array, "B L H"]:
        """Causal attention over the whole sequence with no cache: the test reference."""
        q, k, v = self._qkv(x, positions, inv_freq)
        group = self.num_heads // self.num_kv_heads
        k = jnp.repeat(k, group, axis=2).astype(jnp.float32)
        v = jnp.repeat(v, group, axis=2).astype(jnp.float32)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k) * self.head_dim ** -0.5
        length = x.shape[1]
        causal = jnp.tril(jnp.ones((length, length), bool))
        if self.sliding_window is not None:
            causal = causal & ~jnp.tril(jnp.ones((length, length), bool), -self.sliding_window)
        probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).astype(x.dtype)
        return self.o_proj(out.reshape(*x.shape[:2], -1))


class DecoderLayer(nnx.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs, layer: int = 0):
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = Attention(config, dtype, rngs, config.layer_window(layer))
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MLP(config, dtype, rngs)

    def __call__(self, x, positions, inv_freq, k_pages, v_pages, k_scale, v_scale, batch, layout, backend):
        attn_out, k_pages, v_pages = self.self_attn(
            self.input_layernorm(x), positions, inv_freq, k_pages, v_pages, k_scale, v_scale,
            batch, layout, backend)
        x = x + attn_out
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k_pages, v_pages

    def dense(self, x, positions, inv_freq):
        """No-cache forward of a full batch of sequences."""
        x = x + self.self_attn.dense(self.input_layernorm(x), positions, inv_freq)
        return x + self.mlp(self.post_attention_layernorm(x))
