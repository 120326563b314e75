"""Translate between a Hugging Face `config.json` and jaxpaged's `ModelConfig`.

The keys every family shares are read here; what a family adds (biases, q/k
norms, Gemma's norms and scales, sliding-window layouts, a second RoPE base)
is read and written by its entry in `hf_families.FAMILIES`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxpaged.checkpoint.hf_families import FAMILIES, Family
from jaxpaged.config import ModelConfig

SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
# Multimodal checkpoints served text-only: their language model's `model_type` (vision weights are skipped).
MULTIMODAL_MODEL_TYPES = {"gemma3": "gemma3_text"}
SUPPORTED_TORCH_DTYPES = ("float32", "bfloat16", "float16")
REQUIRED_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def hf_config_to_model_config(hf: dict[str, Any], name: str | None = None) -> ModelConfig:
    """Build a `ModelConfig` from a Hugging Face `config.json` dict of a supported `model_type`.

    Defaults follow the transformers config class of that `model_type` for keys a
    checkpoint may omit. Raises `ValueError` naming the key for architectures or
    options this model does not implement.
    """
    if hf.get("model_type") in MULTIMODAL_MODEL_TYPES:
        hf = _language_model_config(hf)
    model_type = hf.get("model_type", "llama")
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {SUPPORTED_MODEL_TYPES} "
                         f"(and the text model of {MULTIMODAL_MODEL_TYPES})")
    family = FAMILIES[model_type]
    hf = {**family.key_defaults, **hf}
    if hf.get("mlp_bias"):
        raise ValueError("mlp_bias=true is not supported: the MLP has no bias terms")
    missing = [key for key in REQUIRED_KEYS if key not in hf]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)} (needed for a {model_type} model)")
    dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
    if dtype not in SUPPORTED_TORCH_DTYPES:
        raise ValueError(f"unsupported torch_dtype {dtype!r} in config.json; supported: {SUPPORTED_TORCH_DTYPES}")
    num_heads = hf["num_attention_heads"]
    fields = family.read(hf)
    if "sliding_attention" not in (fields.get("layer_types") or ()):
        fields["layer_types"] = None  # every layer full: the same as no layer types
    return ModelConfig(
        name=name or hf.get("_name_or_path") or f"hf-{model_type}",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
        intermediate_size=hf["intermediate_size"],
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", family.tie_default)),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        dtype=dtype,
        bos_token_id=_first_id(hf.get("bos_token_id", family.bos_default)),
        eos_token_id=_first_id(hf.get("eos_token_id", family.eos_default)),
        model_type=model_type,
        **fields,
    )


def _language_model_config(hf: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config's `text_config`, with the outer keys it inherits (dtype, tying, special ids)."""
    text = dict(hf.get("text_config") or {})
    text.setdefault("model_type", MULTIMODAL_MODEL_TYPES[hf["model_type"]])
    for key in ("torch_dtype", "dtype", "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        if key in hf:
            text.setdefault(key, hf[key])
    return text


def model_config_to_hf_config(config: ModelConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` dict for `config` (inverse of `hf_config_to_model_config`).

    Raises `ValueError` naming the fields `config.model_type`'s HF class cannot
    express (e.g. a Qwen2 without q/k/v biases), rather than writing a checkpoint
    transformers would read as a different model.
    """
    family: Family = FAMILIES[config.model_type]
    hf: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": config.model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "max_position_embeddings": config.max_position_embeddings,
        "torch_dtype": config.dtype,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        **family.write(config),
    }
    _check_round_trip(config, hf_config_to_model_config(hf, name=config.name))
    return hf


def _check_round_trip(config: ModelConfig, back: ModelConfig) -> None:
    """Raise unless `back` (read from the written dict) is `config`; layer types compare as windows."""
    if back.layer_windows != config.layer_windows:
        raise ValueError(f"model_type {config.model_type!r} cannot express the per-layer windows "
                         f"{config.layer_windows}")
    differ = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in ("layer_types", "sliding_window")
              and getattr(back, f.name) != getattr(config, f.name)]
    if differ:
        raise ValueError(f"model_type {config.model_type!r} cannot express "
                         + ", ".join(f"{f}={getattr(config, f)!r}" for f in differ))


def _first_id(token_id: int | list[int] | None) -> int | None:
    """HF allows a list of ids (several EOS tokens); `ModelConfig` keeps the first."""
    if isinstance(token_id, list):
        return token_id[0] if token_id else None
    return token_id
