"""The mapping between Hugging Face tensor names and jaxpaged state paths (every supported family).

Llama, Mistral, Qwen2, Qwen3 and Gemma3ForCausalLM share one naming scheme
(`model.layers.{i}.self_attn.q_proj.weight`, ...); a family adds tensors
(biases, `q_norm`/`k_norm`, Gemma's feed-forward norms) as its config says.
"""

from __future__ import annotations

import dataclasses

from jaxpaged.config import ModelConfig
from jaxpaged.checkpoint.skeleton import ParamPath

# HF checkpoints from older transformers versions store the RoPE table; it is derived, not loaded.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
# Gemma3ForConditionalGeneration nests the language model: `model.language_model.` (transformers 5)
# or `language_model.model.` (the Hub's files, transformers 4); its vision tower is not loaded.
LANGUAGE_MODEL_PREFIXES = ("model.language_model.", "language_model.model.")
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
TIED_HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight")

def _layer_tensors(config: ModelConfig) -> list[tuple[str, ParamPath, bool]]:
    """(HF name inside `model.layers.{i}.`, path inside `layers[i]`, is a Linear weight) for one layer."""
    norms = ["input_layernorm", "post_attention_layernorm"]
    if config.sandwich_norms:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    tensors = [(f"{n}.weight", (n, "weight"), False) for n in norms]
    tensors += [(f"self_attn.{p}.weight", ("self_attn", p, "kernel"), True)
                for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    biased = (("q_proj", "k_proj", "v_proj") if config.qkv_bias else ()) + (("o_proj",) if config.o_bias else ())
    tensors += [(f"self_attn.{p}.bias", ("self_attn", p, "bias"), False) for p in biased]
    if config.qk_norm:
        tensors += [(f"self_attn.{n}.weight", ("self_attn", n, "weight"), False) for n in ("q_norm", "k_norm")]
    tensors += [(f"mlp.{p}.weight", ("mlp", p, "kernel"), True) for p in ("gate_proj", "up_proj", "down_proj")]
    return tensors


@dataclasses.dataclass(frozen=True)
class TensorMapping:
    """One HF tensor and the Param it becomes.

    `transpose` is set for Linear weights: HF (PyTorch) stores `[out, in]`, Flax `[in, out]`.
    """

    hf_name: str
    path: ParamPath
    transpose: bool


def tensor_mappings(config: ModelConfig) -> list[TensorMapping]:
    """Every tensor a checkpoint for `config` holds, in HF's usual order."""
    mappings = [TensorMapping("model.embed_tokens.weight", ("embed_tokens", "embedding"), False)]
    layer_tensors = _layer_tensors(config)
    for i in range(config.num_layers):
        mappings += [TensorMapping(f"model.layers.{i}.{name}", ("layers", i, *path), transpose)
                     for name, path, transpose in layer_tensors]
    mappings.append(TensorMapping("model.norm.weight", ("norm", "weight"), False))
    if not config.tie_embeddings:
        mappings.append(TensorMapping("lm_head.weight", ("lm_head", "kernel"), True))
    return mappings


def locate_language_model(mappings: list[TensorMapping], present: set[str]) -> tuple[list[TensorMapping], bool]:
    """`mappings` renamed to where the checkpoint keeps its language model, and whether it is multimodal.

    A causal-LM checkpoint keeps it under `model.`; a multimodal Gemma 3 one
    under one of `LANGUAGE_MODEL_PREFIXES`, found by its embedding's name.
    """
    for prefix in LANGUAGE_MODEL_PREFIXES:
        if prefix + "embed_tokens.weight" in present:
            return [dataclasses.replace(m, hf_name=prefix + m.hf_name.removeprefix("model."))
                    if m.hf_name.startswith("model.") else m for m in mappings], True
    return mappings, False


def is_ignored(hf_name: str, config: ModelConfig, multimodal: bool = False) -> bool:
    """Tensors a valid checkpoint may carry that the model does not load.

    With tied embeddings some exporters still write `lm_head.weight`; like
    transformers, the model uses the embedding and ignores it. A multimodal
    checkpoint's vision tower and projector are not loaded (text only).
    """
    if config.tie_embeddings and hf_name in TIED_HEAD_NAMES:
        return True
    if multimodal and hf_name.startswith(VISION_PREFIXES):
        return True
    return hf_name.endswith(IGNORED_SUFFIXES)
