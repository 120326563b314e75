"""Gemma 2 and Gemma 3 GGUF files (llama.cpp's names, its `1 + w` norms, its metadata keys), written by `gguf`'s
writer from random transformers models: jaxpaged's logits equal transformers' own GGUF loader on the same file.

The models use `head_dim = query_pre_attn_scalar = 256`, as the released Gemma 2 2B/9B and Gemma 3 do: a GGUF
carries no query scale, llama.cpp scales by `1/sqrt(head_dim)` and transformers' GGUF loader by its config
default (256); for other shapes the two loaders disagree and jaxpaged follows llama.cpp. Windows of 4 tokens
over 14, so the sliding layers really slide.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxpaged.checkpoint import load_model, model_config
from tests.checkpoint.gguf_files import write_gguf
from tests.checkpoint.test_checkpoint_hf import TOKENS, model_logits

WINDOW = 4
SHAPES = dict(vocab_size=64, hidden_size=64, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1,
              head_dim=256, query_pre_attn_scalar=256, max_position_embeddings=256, rms_norm_eps=1e-6,
              sliding_window=WINDOW, bos_token_id=1, eos_token_id=2)
# Gemma 2: transformers' defaults for the two softcaps (a Gemma 2 GGUF from llama.cpp carries them);
# Gemma 3: 6 layers, so the 6th is global (every 6th, both loaders' default), 1e6 / 1e4 RoPE bases
FAMILIES = {
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(num_hidden_layers=2, attn_logit_softcapping=50.0,
                                                         final_logit_softcapping=30.0, rope_theta=10000.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(num_hidden_layers=6, rope_theta=1_000_000.0)),
}


def _random_gemma(family: str, seed: int, **shapes):
    """A transformers Gemma with unit-scale random weights and norms away from identity (`shapes` override
    `SHAPES`)."""
    import torch
    import transformers

    config_class, model_class, options = FAMILIES[family]
    config = getattr(transformers, config_class)(**(SHAPES | shapes), **options)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.3 * torch.randn_like(p))
            elif "embed" in name:
                p.normal_(0, 0.3)
            else:
                p.normal_(0, p.shape[-1] ** -0.5)
    return model


def _metadata(family: str):
    """llama.cpp's Gemma keys beside the shared ones `write_gguf` writes."""
    def extra(writer):
        writer.add_sliding_window(WINDOW)
        if family == "gemma2":
            writer.add_attn_logit_softcapping(50.0)
            writer.add_final_logit_softcapping(30.0)
    return extra


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gemma_gguf_logits_equal_transformers_gguf_loader(tmp_path, family):
    import torch
    from transformers import AutoModelForCausalLM

    model = _random_gemma(family, seed=11)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    options = FAMILIES[family][2]
    hf = SHAPES | {"num_hidden_layers": options["num_hidden_layers"], "rope_theta": options["rope_theta"],
                   "model_type": family}
    path = write_gguf(tmp_path / f"{family}.gguf", hf, weights, arch=family, extra=_metadata(family))
    config = model_config(path)
    slides = [w is not None for w in config.layer_windows]
    assert slides == ([True, False] if family == "gemma2" else [True] * 5 + [False])
    assert config.tie_embeddings and config.head_dim == 256 and config.sliding_window == WINDOW
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = reference(torch.from_numpy(TOKENS)).logits.numpy()[0]
        original = model(torch.from_numpy(TOKENS)).logits.numpy()[0]
    np.testing.assert_allclose(expected, original, rtol=2e-4, atol=2e-4)  # the file holds the model
    np.testing.assert_allclose(model_logits(load_model(path)), expected, rtol=2e-4, atol=2e-4)
