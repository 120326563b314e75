"""HF config translation per model_type: what each family's keys mean, defaults, and refusals naming the key."""

from __future__ import annotations

import pytest

from jaxpaged.checkpoint import hf_config_to_model_config
from jaxpaged.checkpoint.hf_config import model_config_to_hf_config
from jaxpaged.config import ModelConfig, RopeScaling, load_config

SHAPES = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 6, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 48}


def read(model_type: str, **keys) -> ModelConfig:
    return hf_config_to_model_config({"model_type": model_type, **SHAPES, **keys})


def test_qwen2_slides_from_max_window_layers_only_with_use_sliding_window():
    assert read("qwen2", sliding_window=16, max_window_layers=4).layer_windows == (None,) * 6
    on = read("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=4)
    assert on.layer_windows == (None,) * 4 + (16, 16)
    assert on.qkv_bias and not on.o_bias and not on.qk_norm and not on.tie_embeddings


def test_qwen3_has_qk_norm_and_attention_bias_covers_o():
    cfg = read("qwen3", attention_bias=True, head_dim=16)
    assert cfg.qk_norm and cfg.qkv_bias and cfg.o_bias and cfg.head_dim == 16


def test_mistral_window_on_every_layer_or_none():
    assert read("mistral", sliding_window=8).layer_windows == (8,) * 6
    assert read("mistral", sliding_window=None).layer_windows == (None,) * 6
    assert read("mistral").sliding_window == 4096  # transformers' MistralConfig default


def test_gemma3_legacy_keys_and_defaults():
    cfg = read("gemma3_text", sliding_window=16, rope_theta=1e6, rope_local_base_freq=1e4,
               rope_scaling={"rope_type": "linear", "factor": 8.0}, query_pre_attn_scalar=168)
    assert cfg.layer_windows == (16,) * 5 + (None,)  # sliding_window_pattern 6: every 6th layer is global
    assert cfg.tie_embeddings and cfg.norm_unit_offset and cfg.sandwich_norms and cfg.scale_embeddings
    assert cfg.hidden_act == "gelu_pytorch_tanh" and cfg.attn_scale == 168 ** -0.5
    assert cfg.rope_scaling == RopeScaling(factor=8.0, rope_type="linear")
    assert (cfg.rope_local_theta, cfg.rope_theta) == (1e4, 1e6)  # sliding layers: local base, unscaled
    assert (cfg.bos_token_id, cfg.eos_token_id) == (2, 1)


def test_gemma3_transformers5_rope_parameters_per_layer_type():
    cfg = read("gemma3_text", sliding_window=16, sliding_window_pattern=3, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}})
    assert cfg.layer_windows == (16, 16, None) * 2
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_scaling.factor) == (5e5, 1e3, 4.0)


def test_multimodal_gemma3_reads_its_text_config_with_gemma3_text_defaults():
    hub = {"model_type": "gemma3", "torch_dtype": "bfloat16", "eos_token_id": [1, 106], "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34, "sliding_window": 1024,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "vision_config": {"hidden_size": 1152}}
    cfg = hf_config_to_model_config(hub)
    assert (cfg.model_type, cfg.dtype, cfg.eos_token_id, cfg.hidden_size) == ("gemma3_text", "bfloat16", 1, 2560)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (8, 4, 256, 262_208)  # class defaults
    assert cfg.tie_embeddings and cfg.layer_windows.count(None) == 5 and cfg.attention_windows == (None, 1024)


@pytest.mark.parametrize("model_type,keys,field", [
    ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma3_text", {"hidden_activation": "relu"}, "hidden_act"),
    ("qwen2", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama", {"mlp_bias": True}, "mlp_bias"),
    ("qwen3", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("phi3", {}, "model_type"),
])
def test_unimplemented_options_are_named(model_type, keys, field):
    with pytest.raises(ValueError, match=field):
        read(model_type, **keys)


@pytest.mark.parametrize("changes,field", [
    ({"model_type": "gpt2"}, "model_type"),
    ({"hidden_act": "relu"}, "hidden_act"),
    ({"query_pre_attn_scalar": 0.0}, "query_pre_attn_scalar"),
    ({"final_logit_softcapping": -1.0}, "final_logit_softcapping"),
    ({"attn_logit_softcapping": 0.0}, "attn_logit_softcapping"),
])
def test_model_config_rejects_unimplemented_fields(changes, field):
    with pytest.raises(ValueError, match=field):
        load_config("tiny").replace(**changes)
    with pytest.raises(ValueError, match="rope_type"):
        RopeScaling(rope_type="yarn")
    assert read("gemma3_text", attn_logit_softcapping=50.0).attn_logit_softcapping == 50.0  # Gemma 2's cap
    assert ModelConfig.from_dict(load_config("tiny").to_dict() | {"attn_logit_softcapping": 50.0}
                                 ).attn_logit_softcapping == 50.0


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-gemma3",
                                  "qwen3-8b", "mistral-7b", "gemma-3-27b", "llama3-8b"])
def test_shipped_configs_round_trip_through_hf(name):
    config = load_config(name)
    assert hf_config_to_model_config(model_config_to_hf_config(config), name=name) == config


@pytest.mark.parametrize("model_type,changes,field", [
    ("qwen2", {"qkv_bias": False}, "qkv_bias"),
    ("llama", {"qk_norm": True}, "qk_norm"),
    ("mistral", {"sliding_window": 8, "layer_types": ("full_attention", "sliding_attention")}, "windows"),
    ("gemma3_text", {"norm_unit_offset": False}, "norm_unit_offset"),
])
def test_writer_refuses_what_the_hf_class_cannot_express(model_type, changes, field):
    base = load_config({"qwen2": "tiny-qwen2", "llama": "tiny", "mistral": "tiny-mistral",
                        "gemma3_text": "tiny-gemma3"}[model_type])
    with pytest.raises(ValueError, match=field):
        model_config_to_hf_config(base.replace(**changes))
