"""The decoder of every supported family: embeddings, N blocks, final norm, LM head.

Llama, Mistral, Qwen2/2.5, Qwen3 and Gemma 3 (text) are this one module with
different `ModelConfig` fields (see `layers.py`); here live the family
switches that sit outside a block: Gemma's embedding scale, Gemma 3's local
RoPE base for sliding layers, and final logit softcapping.

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
from jaxpaged.kv_pool.pool import KVPool
from jaxpaged.model.layers import DecoderLayer, _linear, rms_norm
from jaxpaged.model.rope import rope_inv_freq


class DecoderModel(nnx.Module):
    """A causal decoder LM: RMSNorm, RoPE, GQA, gated MLP, tied or untied embeddings, and the family switches above."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, dtype=None):
        dtype = jnp.dtype(dtype or config.dtype)
        self.config = config
        self.embed_tokens = nnx.Embed(config.vocab_size, config.hidden_size, dtype=dtype,
                                      param_dtype=dtype, rngs=rngs,
                                      embedding_init=nnx.initializers.normal(stddev=1.0))
        self.layers = nnx.List([DecoderLayer(config, dtype, rngs, i) for i in range(config.num_layers)])
        self.norm = rms_norm(config, config.hidden_size, dtype)
        self.lm_head = None if config.tie_embeddings else _linear(
            config.hidden_size, config.vocab_size, dtype, rngs)
        self.inv_freq = nnx.Variable(jnp.asarray(
            rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)))
        kv_layout = kv_cache_layout(config.layer_windows)
        self.layer_group, self.layer_tensor = kv_layout.layer_group, kv_layout.layer_tensor
        # Gemma 3: sliding layers rotate with their own base and no scaling
        self.inv_freq_local = None if config.rope_local_theta is None else nnx.Variable(jnp.asarray(
            rope_inv_freq(config.head_dim, config.rope_local_theta, None)))
        # the tied LM head's product, `dot_general(hidden, embedding)` contracting the embedding's axis 1;
        # None: `embed_tokens.attend` (set by `cpu_gemm.route_model`, as the projections' `dot_general`)
        self.tied_head_dot_general = None

    def _embed(self, token_ids: Int[Array, "..."]) -> Float[Array, "... H"]:
        x = self.embed_tokens(token_ids)
        if self.config.scale_embeddings:  # the scale rounded to the weights' dtype, as HF and vLLM do
            x = x * jnp.asarray(self.config.hidden_size ** 0.5, x.dtype)
        return x

    def _layer_inv_freq(self, layer: int) -> Float[Array, "D2"]:
        if self.inv_freq_local is not None and self.config.layer_window(layer) is not None:
            return self.inv_freq_local[...]
        return self.inv_freq[...]

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
        x = self._embed(token_ids)
        new_k, new_v = list(pool.k), list(pool.v)
        for i, layer in enumerate(self.layers):
            t = self.layer_tensor[i]  # the pool tensor this layer shares with its peers in other groups
            x, new_k[t], new_v[t] = layer(x, positions, self._layer_inv_freq(i), new_k[t], new_v[t], pool.k_scale[i],
                                          pool.v_scale[i], batch.for_group(self.layer_group[i]), layout, backend)
        return self.norm(x), pool._replace(k=tuple(new_k), v=tuple(new_v))

    def logits(self, hidden: Float[Array, "... H"]) -> Float[Array, "... V"]:
        """LM head in float32, softcapped as `cap * tanh(logits / cap)` when the config sets a cap."""
        if self.lm_head is None and self.tied_head_dot_general is not None:
            logits = self.tied_head_dot_general(hidden, self.embed_tokens.embedding[...],
                                                (((hidden.ndim - 1,), (1,)), ((), ()))).astype(jnp.float32)
        elif self.lm_head is None:
            logits = self.embed_tokens.attend(hidden).astype(jnp.float32)
        else:
            logits = self.lm_head(hidden).astype(jnp.float32)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else cap * jnp.tanh(logits / cap)

    def forward_dense(self, token_ids: Int[Array, "B L"]) -> Float[Array, "B L V"]:
        """Full causal recompute with no cache: the independent reference for the paged path."""
        positions = jnp.broadcast_to(jnp.arange(token_ids.shape[1]), token_ids.shape)
        x = self._embed(token_ids)
        for i, layer in enumerate(self.layers):
            x = layer.dense(x, positions, self._layer_inv_freq(i))
        return self.logits(self.norm(x))


def init_model(config: ModelConfig, seed: int = 0, dtype=None) -> DecoderModel:
    """A model with random weights drawn from `seed`."""
    return DecoderModel(config, rngs=nnx.Rngs(seed), dtype=dtype)
