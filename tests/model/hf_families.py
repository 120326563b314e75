"""Random-weight transformers checkpoints of each supported family, for tests that compare against transformers.

Each family is a tiny config of its transformers class with every option
jaxpaged implements switched on where the family has it (biases, q/k norms,
sliding windows of W = 32 on some layers, Gemma's query_pre_attn_scalar,
final softcapping, Gemma 2's attention-logit softcapping (transformers' Gemma 3
reads `attn_logit_softcapping` but never applies it, so Gemma 2 is the reference
for it), local RoPE base and linear scaling). Weights are redrawn
at unit scale so logits are far from uniform (transformers' own init gives
near-ties that make greedy tokens fragile), norms are away from their
identity, and biases are non-zero.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

WINDOW = 32
VOCAB = 96

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)


@dataclasses.dataclass(frozen=True)
class HFFamily:
    """One transformers causal-LM class and the config options its test checkpoint sets."""

    name: str
    config_class: str
    model_class: str
    options: dict
    unit_offset_norms: bool = False  # Gemma stores norm weights as w - 1

    def build(self, seed: int):
        """The transformers model with random weights drawn from `seed` (eager attention, float32)."""
        import torch
        import transformers

        config = getattr(transformers, self.config_class)(**COMMON, **self.options)
        config._attn_implementation = "eager"
        torch.manual_seed(seed)
        model = getattr(transformers, self.model_class)(config).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.copy_(float(not self.unit_offset_norms) + 0.3 * torch.randn_like(p))
                elif name.endswith("bias"):
                    p.normal_(0, 0.3)
                elif "embed" in name:
                    p.normal_(0, 0.3 if self.unit_offset_norms else 1.0)  # Gemma scales by sqrt(hidden)
                else:
                    p.normal_(0, p.shape[-1] ** -0.5)
        return model

    def save(self, path: Path, seed: int = 0):
        """Build, `save_pretrained` into `path` (config.json + model.safetensors); returns the model."""
        model = self.build(seed)
        model.save_pretrained(path)
        return model


FAMILIES = {
    "llama": HFFamily("llama", "LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True)),
    "mistral": HFFamily("mistral", "MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "qwen2": HFFamily("qwen2", "Qwen2Config", "Qwen2ForCausalLM", dict(
        use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, tie_word_embeddings=True)),
    "qwen3": HFFamily("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(
        use_sliding_window=True, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    "gemma3": HFFamily("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=24,
        final_logit_softcapping=10.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
        rope_theta=20000.0, rope_local_base_freq=1000.0), unit_offset_norms=True),
    "gemma2": HFFamily("gemma2", "Gemma2Config", "Gemma2ForCausalLM", dict(
        sliding_window=WINDOW, query_pre_attn_scalar=24, final_logit_softcapping=10.0,
        attn_logit_softcapping=2.0), unit_offset_norms=True),
}


CHATML_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                   "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_chatml_tokenizer(path: Path, *, bos: bool = False) -> None:
    """A byte-level `tokenizer.json` (256 byte tokens, then <|im_start|> = 256 and <|im_end|> = 257) and a
    `tokenizer_config.json` with Qwen's ChatML template, as a Qwen checkpoint directory carries them.

    With `bos`, also a BOS token `<s>` = 258 that the tokenizer adds to every text and the template
    writes first (`{{ bos_token }}`), as Llama 3 and Gemma checkpoints do."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"] + (["<s>"] if bos else []))
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 258)])
    tok.save(str(path / "tokenizer.json"))
    template = ("{{ bos_token }}" if bos else "") + CHATML_TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "eos_token": "<|im_end|>", "bos_token": "<s>" if bos else None}))


def save_multimodal_gemma3(path: Path, seed: int = 0):
    """A Gemma3ForConditionalGeneration (tiny SigLIP tower) whose language model is FAMILIES["gemma3"]'s,
    less final softcapping: transformers' multimodal class does not apply it (its text class and vLLM do;
    Gemma 3 checkpoints set it to null)."""
    import torch
    import transformers

    options = FAMILIES["gemma3"].options | {"final_logit_softcapping": None}
    text = transformers.Gemma3TextConfig(**COMMON, **options)
    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.model.language_model.named_parameters():
            if "norm" in name:
                p.copy_(0.3 * torch.randn_like(p))
            elif "embed" in name:
                p.normal_(0, 0.3)
            else:
                p.normal_(0, p.shape[-1] ** -0.5)
    model.save_pretrained(path)
    return model
