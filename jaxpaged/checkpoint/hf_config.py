"""Translate between a Hugging Face Llama `config.json` and jaxpaged's `ModelConfig`."""

from __future__ import annotations

from typing import Any

from jaxpaged.config import ModelConfig, RopeScaling

SUPPORTED_MODEL_TYPES = ("llama",)
SUPPORTED_TORCH_DTYPES = ("float32", "bfloat16", "float16")
REQUIRED_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def hf_config_to_model_config(hf: dict[str, Any], name: str | None = None) -> ModelConfig:
    """Build a `ModelConfig` from a Hugging Face Llama `config.json` dict.

    Defaults follow `transformers.LlamaConfig` for keys a checkpoint may omit.
    Raises `ValueError` for architectures or options this model does not implement.
    """
    model_type = hf.get("model_type", "llama")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}; only 'silu' (SwiGLU) is implemented")
    for flag in ("attention_bias", "mlp_bias"):
        if hf.get(flag):
            raise ValueError(f"{flag}=true is not supported: the model has no bias terms")
    missing = [key for key in REQUIRED_KEYS if key not in hf]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)} (needed for a Llama model)")
    dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
    if dtype not in SUPPORTED_TORCH_DTYPES:
        raise ValueError(f"unsupported torch_dtype {dtype!r} in config.json; supported: {SUPPORTED_TORCH_DTYPES}")
    num_heads = hf["num_attention_heads"]
    rope_theta, rope_scaling = _rope(hf)
    return ModelConfig(
        name=name or hf.get("_name_or_path") or "hf-llama",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
        intermediate_size=hf["intermediate_size"],
        rope_theta=float(rope_theta),
        rope_scaling=rope_scaling,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        dtype=dtype,
        bos_token_id=_first_id(hf.get("bos_token_id")),
        eos_token_id=_first_id(hf.get("eos_token_id")),
    )


def model_config_to_hf_config(config: ModelConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` dict for `config` (inverse of `hf_config_to_model_config`)."""
    hf: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "max_position_embeddings": config.max_position_embeddings,
        "torch_dtype": config.dtype,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
    }
    if config.rope_scaling is not None:
        s = config.rope_scaling
        hf["rope_scaling"] = {
            "rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    return hf


def _rope(hf: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """RoPE base and scaling, from `rope_theta`/`rope_scaling` or the newer `rope_parameters`."""
    params = hf.get("rope_parameters")
    if params is not None:  # transformers >= 5 folds theta and scaling into one dict
        theta, scaling = params.get("rope_theta", hf.get("rope_theta", 10000.0)), params
    else:
        theta, scaling = hf.get("rope_theta", 10000.0), hf.get("rope_scaling")
    if not scaling:
        return theta, None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope_scaling type {rope_type!r}; only 'llama3' is implemented")
    missing = [key for key in ("factor", "low_freq_factor", "high_freq_factor",
                               "original_max_position_embeddings") if key not in scaling]
    if missing:
        raise ValueError(f"config.json rope_scaling lacks {', '.join(missing)}")
    return theta, RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
    )


def _first_id(token_id: int | list[int] | None) -> int | None:
    """HF allows a list of ids (several EOS tokens); `ModelConfig` keeps the first."""
    if isinstance(token_id, list):
        return token_id[0] if token_id else None
    return token_id
