"""The mapping between Hugging Face Llama tensor names and jaxpaged state paths."""

from __future__ import annotations

import dataclasses

from jaxpaged.config import ModelConfig
from jaxpaged.checkpoint.skeleton import ParamPath

# HF checkpoints from older transformers versions store the RoPE table; it is derived, not loaded.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)

_LAYER_TENSORS = (
    # (HF name inside `model.layers.{i}.`, path inside `layers[i]`, is a Linear weight)
    ("input_layernorm.weight", ("input_layernorm", "weight"), False),
    ("post_attention_layernorm.weight", ("post_attention_layernorm", "weight"), False),
    *((f"self_attn.{p}.weight", ("self_attn", p, "kernel"), True) for p in ("q_proj", "k_proj", "v_proj", "o_proj")),
    *((f"mlp.{p}.weight", ("mlp", p, "kernel"), True) for p in ("gate_proj", "up_proj", "down_proj")),
)


@dataclasses.dataclass(frozen=True)
class TensorMapping:
    """One HF tensor and the Param it becomes.

    `transpose` is set for Linear weights: HF (PyTorch) stores `[out, in]`, Flax `[in, out]`.
    """

    hf_name: str
    path: ParamPath
    transpose: bool


def tensor_mappings(config: ModelConfig) -> list[TensorMapping]:
    """Every tensor a Llama checkpoint for `config` holds, in HF's usual order."""
    mappings = [TensorMapping("model.embed_tokens.weight", ("embed_tokens", "embedding"), False)]
    for i in range(config.num_layers):
        mappings += [TensorMapping(f"model.layers.{i}.{name}", ("layers", i, *path), transpose)
                     for name, path, transpose in _LAYER_TENSORS]
    mappings.append(TensorMapping("model.norm.weight", ("norm", "weight"), False))
    if not config.tie_embeddings:
        mappings.append(TensorMapping("lm_head.weight", ("lm_head", "kernel"), True))
    return mappings


def is_ignored(hf_name: str, config: ModelConfig) -> bool:
    """Tensors a valid checkpoint may carry that the model does not load.

    With tied embeddings some exporters still write `lm_head.weight`; like
    transformers, the model uses the embedding and ignores it.
    """
    if config.tie_embeddings and hf_name == "lm_head.weight":
        return True
    return hf_name.endswith(IGNORED_SUFFIXES)
