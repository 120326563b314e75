"""What each Hugging Face `model_type` adds to the shared keys: read into `ModelConfig` fields, and written back.

Defaults for absent keys are those of the transformers config class of that
`model_type` (transformers 5), so a sparse `config.json` means what it means there.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxpaged.checkpoint.hf_rope import read_rope, write_rope_scaling
from jaxpaged.config import ModelConfig

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclasses.dataclass(frozen=True)
class Family:
    """One `model_type`: its HF class, defaults for absent keys, and its own keys both ways."""

    architecture: str
    read: Callable[[dict[str, Any]], dict[str, Any]]  # HF dict -> ModelConfig fields
    write: Callable[[ModelConfig], dict[str, Any]]  # ModelConfig -> HF keys
    tie_default: bool = False
    bos_default: int | None = None
    eos_default: int | None = None
    key_defaults: dict = dataclasses.field(default_factory=dict)  # shapes the HF class defaults (Gemma 3)


def _silu_only(hf: dict[str, Any]) -> str:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported hidden_act {act!r} for model_type {hf.get('model_type', 'llama')!r}; "
                         f"only 'silu' (SwiGLU) is implemented")
    return act


def _rope_fields(hf: dict[str, Any]) -> dict[str, Any]:
    theta, scaling = read_rope(hf, hf.get("rope_parameters"), 10000.0)
    return {"rope_theta": theta, "rope_scaling": scaling}


def _write_rope(config: ModelConfig) -> dict[str, Any]:
    return {"rope_theta": config.rope_theta, "rope_scaling": write_rope_scaling(config.rope_scaling)}


def _layer_types(config: ModelConfig) -> list[str]:
    return [FULL if w is None else SLIDING for w in config.layer_windows]


# --- Llama, Mistral ------------------------------------------------------------------------------

def _read_llama(hf):
    bias = bool(hf.get("attention_bias", False))
    return {"hidden_act": _silu_only(hf), "qkv_bias": bias, "o_bias": bias, **_rope_fields(hf)}


def _write_llama(config):
    return {"hidden_act": config.hidden_act, "attention_bias": config.qkv_bias, "mlp_bias": False,
            **_write_rope(config)}


def _read_mistral(hf):
    # every layer slides when `sliding_window` is set; Mistral ignores `layer_types` (transformers warns)
    return {"hidden_act": _silu_only(hf), "sliding_window": hf.get("sliding_window", 4096), **_rope_fields(hf)}


def _write_mistral(config):
    return {"hidden_act": config.hidden_act, "sliding_window": config.sliding_window, **_write_rope(config)}


# --- Qwen2 / Qwen2.5, Qwen3 ----------------------------------------------------------------------

def _qwen_windows(hf: dict[str, Any]) -> dict[str, Any]:
    """`use_sliding_window` gates `sliding_window`; layers from `max_window_layers` on slide (HF and vLLM)."""
    window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window", False) else None
    layer_types = hf.get("layer_types")
    if layer_types is None and window is not None:
        first = hf.get("max_window_layers", 28)
        layer_types = [SLIDING if i >= first else FULL for i in range(hf["num_hidden_layers"])]
    return {"sliding_window": window, "layer_types": None if layer_types is None else tuple(layer_types)}


def _write_qwen_windows(config: ModelConfig) -> dict[str, Any]:
    types = _layer_types(config)
    first_sliding = types.index(SLIDING) if SLIDING in types else config.num_layers
    return {"use_sliding_window": config.sliding_window is not None,
            "sliding_window": config.sliding_window, "layer_types": types,
            "max_window_layers": first_sliding}


def _read_qwen2(hf):
    return {"hidden_act": _silu_only(hf), "qkv_bias": True, **_qwen_windows(hf), **_rope_fields(hf)}


def _write_qwen2(config):
    return {"hidden_act": config.hidden_act, **_write_qwen_windows(config), **_write_rope(config)}


def _read_qwen3(hf):
    bias = bool(hf.get("attention_bias", False))
    return {"hidden_act": _silu_only(hf), "qkv_bias": bias, "o_bias": bias, "qk_norm": True,
            **_qwen_windows(hf), **_rope_fields(hf)}


def _write_qwen3(config):
    return {"hidden_act": config.hidden_act, "attention_bias": config.qkv_bias,
            **_write_qwen_windows(config), **_write_rope(config)}


# --- Gemma 3 (text) ------------------------------------------------------------------------------

def _read_gemma3(hf):
    if hf.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention=true is not supported: attention is causal")
    window = hf.get("sliding_window", 4096)
    layer_types = hf.get("layer_types")
    if layer_types is None:  # the older `sliding_window_pattern`: every n-th layer is global
        pattern = hf.get("sliding_window_pattern", 6)
        layer_types = [SLIDING if (i + 1) % pattern else FULL for i in range(hf["num_hidden_layers"])]
    params = hf.get("rope_parameters")
    if params is not None and FULL in params:  # transformers 5: one RoPE dict per layer type
        theta, scaling = read_rope(hf, params[FULL], 1_000_000.0)
        local_theta, local_scaling = read_rope(hf, params.get(SLIDING) or {}, 10_000.0)
        if local_scaling is not None:
            raise ValueError("rope_parameters.sliding_attention: scaling of the local RoPE is not supported")
    else:
        theta, scaling = read_rope(hf, None, 1_000_000.0)
        local_theta = float(hf.get("rope_local_base_freq", 10_000.0))
    bias = bool(hf.get("attention_bias", False))
    return {
        "hidden_act": hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh",
        "qkv_bias": bias, "o_bias": bias, "qk_norm": True, "norm_unit_offset": True,
        "scale_embeddings": True, "sandwich_norms": True,
        "query_pre_attn_scalar": float(hf.get("query_pre_attn_scalar", 256)),
        "final_logit_softcapping": hf.get("final_logit_softcapping"),
        "attn_logit_softcapping": hf.get("attn_logit_softcapping"),  # null in Google's Gemma 3 configs
        "sliding_window": window, "layer_types": tuple(layer_types),
        "rope_theta": theta, "rope_scaling": scaling,
        "rope_local_theta": None if local_theta == theta else local_theta,
    }


def _write_gemma3(config):
    return {
        "hidden_activation": config.hidden_act, "attention_bias": config.qkv_bias,
        "query_pre_attn_scalar": _int_if_whole(config.query_pre_attn_scalar),  # transformers wants an int
        "final_logit_softcapping": config.final_logit_softcapping,
        "attn_logit_softcapping": config.attn_logit_softcapping,
        "use_bidirectional_attention": False,
        "sliding_window": config.sliding_window, "layer_types": _layer_types(config),
        "rope_local_base_freq": config.rope_local_theta or config.rope_theta, **_write_rope(config),
    }


# --- Gemma 2 ---------------------------------------------------------------------------------------

def _read_gemma2(hf):
    """Gemma 3's layer without q/k norms, with one RoPE base and attention-logit softcapping."""
    hf = {"final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,  # Gemma2Config's defaults
          "sliding_window_pattern": 2, **hf}  # no layer_types: even layers slide (0, 2, ...)
    params = hf.pop("rope_parameters", None)  # transformers 5: one dict, no per-layer-type bases
    theta, _ = read_rope(hf, params, 10_000.0)
    rope = {"rope_theta": theta, "rope_scaling": params or hf.get("rope_scaling"), "rope_local_base_freq": theta}
    return _read_gemma3({**hf, **rope}) | {"qk_norm": False}


def _write_gemma2(config):
    keys = _write_gemma3(config)
    del keys["rope_local_base_freq"], keys["use_bidirectional_attention"]
    return keys


# transformers' Gemma3TextConfig defaults: the Hub's multimodal configs leave some of these out of text_config
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
                        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                        "head_dim": 256, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6}


def _int_if_whole(value: float | None) -> float | int | None:
    return int(value) if value is not None and float(value).is_integer() else value


FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaForCausalLM", _read_llama, _write_llama, bos_default=1, eos_default=2),
    "mistral": Family("MistralForCausalLM", _read_mistral, _write_mistral, bos_default=1, eos_default=2),
    "qwen2": Family("Qwen2ForCausalLM", _read_qwen2, _write_qwen2),
    "qwen3": Family("Qwen3ForCausalLM", _read_qwen3, _write_qwen3),
    "gemma2": Family("Gemma2ForCausalLM", _read_gemma2, _write_gemma2, tie_default=True,
                     bos_default=2, eos_default=1),
    "gemma3_text": Family("Gemma3ForCausalLM", _read_gemma3, _write_gemma3, tie_default=True,
                          bos_default=2, eos_default=1, key_defaults=GEMMA3_TEXT_DEFAULTS),
}
