"""A GGUF file's metadata as a Hugging Face `config.json` dict, so one reader (`hf_config_to_model_config`) builds
the `ModelConfig` of both formats.

GGUF keys are llama.cpp's (`{arch}.block_count`, `{arch}.attention.head_count_kv`, ...). An architecture,
RoPE variant or per-layer shape this model does not implement is refused naming it.
"""

from __future__ import annotations

from typing import Any

from jaxpaged.gguf_file import GGUFFile

# GGUF `general.architecture` -> Hugging Face `model_type`. Mistral's GGUFs say "llama" (same tensors, same RoPE).
GGUF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3_text"}
GEMMA_ARCHITECTURES = ("gemma2", "gemma3")
# llama.cpp's Gemma 3 graph rotates its sliding layers with this base; no GGUF key carries it
GEMMA3_LOCAL_ROPE_BASE = 10_000.0
# Whole-tensor float types pick the serving dtype when every matrix has one; anything quantized serves in float32.
FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def gguf_to_hf_config(gguf: GGUFFile) -> dict[str, Any]:
    """The `config.json` dict transformers would build for `gguf` (the keys jaxpaged reads)."""
    arch = gguf.architecture
    if arch not in GGUF_MODEL_TYPES:
        raise ValueError(f"{gguf.path}: unsupported GGUF architecture {arch!r}; supported: {sorted(GGUF_MODEL_TYPES)}")
    if "rope_freqs.weight" in gguf.tensor_names():
        raise ValueError(f"{gguf.path}: per-dimension RoPE factors (rope_freqs.weight, Llama 3.1-style scaling) "
                         "are not supported in GGUF files; convert the Hugging Face checkpoint instead")
    heads = _uniform(gguf, "attention.head_count")
    hidden = gguf.arch_get("embedding_length")
    head_dim = gguf.arch_get("attention.key_length") or hidden // heads
    value_dim = gguf.arch_get("attention.value_length") or head_dim
    if value_dim != head_dim:
        raise ValueError(f"{gguf.path}: attention.value_length {value_dim} != key_length {head_dim} is not supported")
    rope_dims = gguf.arch_get("rope.dimension_count") or head_dim
    if rope_dims != head_dim:
        raise ValueError(f"{gguf.path}: rope.dimension_count {rope_dims} != head_dim {head_dim} (partial RoPE) "
                         "is not supported")
    tokens = gguf.get("tokenizer.ggml.tokens") or ()
    hf: dict[str, Any] = {
        "model_type": GGUF_MODEL_TYPES[arch],
        "vocab_size": gguf.arch_get("vocab_size") or len(tokens),
        "hidden_size": hidden,
        "num_hidden_layers": gguf.arch_get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _uniform(gguf, "attention.head_count_kv", heads),
        "head_dim": head_dim,
        "intermediate_size": _uniform(gguf, "feed_forward_length"),
        "rms_norm_eps": gguf.arch_get("attention.layer_norm_rms_epsilon", 1e-6),
        "max_position_embeddings": gguf.arch_get("context_length", 2048),
        "rope_theta": gguf.arch_get("rope.freq_base", 10_000.0),
        "rope_scaling": _rope_scaling(gguf),
        "tie_word_embeddings": "output.weight" not in gguf.tensor_names(),
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensor_names(),
        "torch_dtype": serving_dtype(gguf),
        "bos_token_id": gguf.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": gguf.get("tokenizer.ggml.eos_token_id"),
    }
    if arch in GEMMA_ARCHITECTURES:
        hf |= gemma_keys(gguf, head_dim)
    missing = [key for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
               if hf[key] is None]
    if missing or not hf["vocab_size"]:
        raise ValueError(f"{gguf.path}: GGUF metadata lacks the {arch}. keys for {missing or ['vocab_size']}")
    return hf


def gemma_keys(gguf: GGUFFile, head_dim: int) -> dict[str, Any]:
    """What a Gemma 2 / Gemma 3 GGUF adds, read as llama.cpp runs the file.

    GGUF has no `query_pre_attn_scalar`: llama.cpp scales queries by `1/sqrt(head_dim)`, so the scalar is
    `head_dim` (the Gemma 2 27B's `hidden/heads` differs and is not recoverable from the file; transformers'
    GGUF loader uses its config default, 256, which is `head_dim` for the released 2B-27B Gemma 3 and
    2B/9B Gemma 2). Gemma 3's local RoPE base is llama.cpp's constant; its layer pattern is
    `attention.sliding_window_pattern` when the file has it, else every 6th layer global (both loaders' default).
    """
    keys: dict[str, Any] = {"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": head_dim,
                            "sliding_window": gguf.arch_get("attention.sliding_window", 4096)}
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if gguf.has(f"{gguf.architecture}.{key}"):
            keys[key] = float(gguf.arch_get(key))
    if gguf.architecture == "gemma3":
        keys["rope_local_base_freq"] = GEMMA3_LOCAL_ROPE_BASE
        pattern = gguf.arch_get("attention.sliding_window_pattern")
        if isinstance(pattern, int):
            keys["sliding_window_pattern"] = pattern
        elif isinstance(pattern, list):  # per layer: true where the layer slides
            keys["layer_types"] = ["sliding_attention" if slides else "full_attention" for slides in pattern]
    return keys


def serving_dtype(gguf: GGUFFile) -> str:
    """float16 / bfloat16 when every matrix is stored so; else float32 (what a dequantized weight is)."""
    types = {gguf.tensor_type(name) for name in gguf.tensor_names() if len(gguf.tensor_shape(name)) == 2}
    found = {FLOAT_DTYPES.get(t) for t in types}
    return found.pop() if len(found) == 1 and None not in found else "float32"


def _uniform(gguf: GGUFFile, key: str, default: Any = None) -> Any:
    """`{arch}.{key}`; a per-layer list is accepted only when every layer has the same value."""
    value = gguf.arch_get(key, default)
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(f"{gguf.path}: per-layer {gguf.architecture}.{key} {value} is not supported "
                             "(every layer must have the same shape)")
        value = value[0]
    return value


def _rope_scaling(gguf: GGUFFile) -> dict[str, Any] | None:
    kind = gguf.arch_get("rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(gguf.arch_get("rope.scaling.factor"))}
    raise ValueError(f"{gguf.path}: unsupported GGUF rope.scaling.type {kind!r}; 'linear' is implemented")
