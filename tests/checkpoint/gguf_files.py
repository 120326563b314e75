"""Writing small GGUF files for the tests with `gguf.GGUFWriter`, as llama.cpp's converter lays them out.

`write_gguf` takes Hugging Face names and `[out, in]` weights (e.g. from
`test_checkpoint_hf.random_hf_weights`), renames them to llama.cpp's names,
interleaves the RoPE halves of each Llama q/k head as llama.cpp's `permute`
does (written here from its definition, not through jaxpaged), stores Gemma's
norm weights as `1 + w` as llama.cpp's Gemma converters do, and stores each
tensor as the ggml type `qtype_of(name)` picks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


# Gemma (llama.cpp's Gemma2Model / Gemma3Model): four norms per layer, the pre-feed-forward one is `ffn_norm`
GEMMA_LAYER = LAYER | {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                       "post_feedforward_layernorm": "post_ffw_norm"}
GEMMA_ARCHS = ("gemma2", "gemma3")


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    """llama.cpp's name for a Hugging Face tensor name."""
    if hf_name in GLOBAL:
        return GLOBAL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{(GEMMA_LAYER if arch in GEMMA_ARCHS else LAYER)[module]}.{suffix}"


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's `permute` (convert_hf_to_gguf.py): per head, the two RoPE halves interleaved row by row."""
    return (weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def store(writer, name: str, tensor: np.ndarray, qtype: str) -> None:
    """Add `tensor` (float, numpy order) to `writer` as ggml type `qtype`."""
    from gguf import GGMLQuantizationType, quants

    kind = GGMLQuantizationType[qtype]
    if qtype == "F32":
        writer.add_tensor(name, tensor.astype(np.float32))
    elif qtype == "F16":
        writer.add_tensor(name, tensor.astype(np.float16))
    else:
        writer.add_tensor(name, quants.quantize(tensor.astype(np.float32), kind), raw_dtype=kind)


def add_byte_vocab(writer, vocab_size: int, *, chat_template: str | None = None, bos: int = 1, eos: int = 2) -> None:
    """A byte-level BPE vocabulary of `vocab_size` tokens: specials, then byte pieces (no merges needed)."""
    from gguf import TokenType

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    pieces = [chr(c) for c in range(ord("!"), ord("~") + 1)]  # byte-level BPE spells these bytes as themselves
    tokens = (specials + pieces + [f"<unused{i}>" for i in range(vocab_size)])[:vocab_size]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_merges([])
    writer.add_token_types([TokenType.CONTROL if t in specials else TokenType.NORMAL for t in tokens])
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def write_gguf(path: Path, hf: dict, weights: dict[str, np.ndarray], *, qtype_of=lambda name: "F32",
               arch: str | None = None, chat_template: str | None = None, extra=None, add_vocab=None) -> Path:
    """Write `weights` (HF names) of config dict `hf` as a GGUF file at `path`; `extra(writer)` adds more keys;
    `add_vocab(writer)` writes the vocabulary (default: `add_byte_vocab`)."""
    from gguf import GGUFWriter

    arch = arch or hf["model_type"]
    writer = GGUFWriter(path, arch)
    heads, kv_heads = hf["num_attention_heads"], hf["num_key_value_heads"]
    writer.add_block_count(hf["num_hidden_layers"])
    writer.add_context_length(hf["max_position_embeddings"])
    writer.add_embedding_length(hf["hidden_size"])
    writer.add_feed_forward_length(hf["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    if hf.get("head_dim"):
        writer.add_key_length(hf["head_dim"])
        writer.add_value_length(hf["head_dim"])
    writer.add_layer_norm_rms_eps(hf["rms_norm_eps"])
    writer.add_rope_freq_base(hf["rope_theta"])
    writer.add_vocab_size(hf["vocab_size"])
    if add_vocab is None:
        add_byte_vocab(writer, hf["vocab_size"], chat_template=chat_template,
                       bos=hf.get("bos_token_id", 1), eos=hf.get("eos_token_id", 2))
    else:
        add_vocab(writer)
    if extra is not None:
        extra(writer)
    for name, tensor in weights.items():
        if arch in GEMMA_ARCHS and name.endswith("norm.weight"):
            tensor = tensor + 1.0  # llama.cpp's Gemma converter stores 1 + w
        if arch == "llama" and ".self_attn.q_proj." in name:
            tensor = llama_cpp_permute(tensor, heads)
        elif arch == "llama" and ".self_attn.k_proj." in name:
            tensor = llama_cpp_permute(tensor, kv_heads)
        store(writer, gguf_name(name, arch), tensor, qtype_of(name) if tensor.ndim == 2 else "F32")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
