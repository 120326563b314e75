"""Llama-3-style decoder: embeddings, N pre-norm blocks, final norm, LM head.

The module holds weights only. The KV pool goes in and comes out of `__call__`
as plain arrays, so the step that calls it stays a pure function.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from jaxpaged.attention import AttentionBackend, AttentionBatch, StepLayout
from jaxpaged.cache.kv_groups import kv_cache_layout
from jaxpaged.config import ModelConfig
from jaxpaged.kv.pool import KVPool
from jaxpaged.model.layers import DecoderLayer, RMSNorm, _linear
from jaxpaged.model.rope import rope_inv_freq


class LlamaModel(nnx.Module):
    """A Llama-family causal LM (RMSNorm, RoPE, GQA, SwiGLU; tied or untied embeddings)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype=None):
        dtype = jnp.dtype(dtype or config.dtype)
        self.config = config
        self.embed_tokens = nnx.Embed(config.vocab_size, config.hidden_size, dtype=dtype,
                                      param_dtype=dtype, rngs=rngs,
                                      embedding_init=nnx.initializers.normal(stddev=1.0))
        self.layers = nnx.List([DecoderLayer(config, dtype, rngs, i) for i in range(config.num_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = None if config.tie_embeddings else _linear(
            config.hidden_size, config.vocab_size, dtype, rngs)
        self.inv_freq = nnx.Variable(jnp.asarray(
            rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)))
        kv_layout = kv_cache_layout(config.layer_windows)
        self.layer_group, self.layer_tensor = kv_layout.layer_group, kv_layout.layer_tensor

    def __call__(
        self,
        token_ids: Int[Array, "T"],
        positions: Int[Array, "T"],
        pool: KVPool,
        batch: AttentionBatch,
        layout: StepLayout,
        backend: AttentionBackend,
    ) -> tuple[Float[Array, "T H"], KVPool]:
        """Run one step's tokens through the paged model; returns final hidden states and the new pool."""
        x = self.embed_tokens(token_ids)
        inv_freq = self.inv_freq[...]
        new_k, new_v = list(pool.k), list(pool.v)
        for i, layer in enumerate(self.layers):
            t = self.layer_tensor[i]  # the pool tensor this layer shares with its peers in other groups
            x, new_k[t], new_v[t] = layer(x, positions, inv_freq, new_k[t], new_v[t], pool.k_scale[i],
                                          pool.v_scale[i], batch.for_group(self.layer_group[i]), layout, backend)
        return self.norm(x), pool._replace(k=tuple(new_k), v=tuple(new_v))

    def logits(self, hidden: Float[Array, "... H"]) -> Float[Array, "... V"]:
        """LM head in float32."""
        if self.lm_head is None:
            return self.embed_tokens.attend(hidden).astype(jnp.float32)
        return self.lm_head(hidden).astype(jnp.float32)

    def forward_dense(self, token_ids: Int[Array, "B L"]) -> Float[Array, "B L V"]:
        """Full causal recompute with no cache: the independent reference for the paged path."""
        positions = jnp.broadcast_to(jnp.arange(token_ids.shape[1]), token_ids.shape)
        x = self.embed_tokens(token_ids)
        inv_freq = self.inv_freq[...]
        for layer in self.layers:
            x = layer.dense(x, positions, inv_freq)
        return self.logits(self.norm(x))


def init_model(config: ModelConfig, seed: int = 0, dtype=None) -> LlamaModel:
    """A model with random weights drawn from `seed`."""
    return LlamaModel(config, rngs=nnx.Rngs(seed), dtype=dtype)
