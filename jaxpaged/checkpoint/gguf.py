"""Load a GGUF checkpoint (llama.cpp's format) into a `DecoderModel`: weights dequantized at load, names mapped.

Every tensor is dequantized by the `gguf` package to float32 numpy, then cast
to the serving dtype: weights stay dequantized on the device (there are no
quantized matmul kernels). llama.cpp's converter interleaves the two RoPE
halves of each Llama q/k head (`permute` in convert_hf_to_gguf.py); it is
undone here so the weights are the Hugging Face ones again. Qwen and Gemma GGUFs
keep the Hugging Face row order (llama.cpp runs them with NeoX-style RoPE).
llama.cpp stores Gemma's norm weights as `1 + w`, which is undone too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxpaged.checkpoint.gguf_config import GEMMA_ARCHITECTURES, gguf_to_hf_config
from jaxpaged.checkpoint.hf import _check_tensors, _to_flax
from jaxpaged.checkpoint.hf_config import hf_config_to_model_config
from jaxpaged.checkpoint.hf_names import tensor_mappings
from jaxpaged.checkpoint.skeleton import ShardingOf, abstract_params, assemble_model
from jaxpaged.config import ModelConfig
from jaxpaged.gguf_file import GGUFFile, is_gguf_file, open_gguf
from jaxpaged.model.decoder import DecoderModel

__all__ = ["SUPPORTED_TENSOR_TYPES", "check_gguf_checkpoint", "is_gguf_file", "load_gguf_checkpoint",
           "read_gguf_config"]

# ggml types read: plain floats, the legacy block quants and the K-quants (all dequantized by `gguf` in numpy).
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                          "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
# `blk.{i}.` + GGUF name -> `model.layers.{i}.` + Hugging Face name (biases follow their weights).
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# Gemma's four norms per layer: llama.cpp calls the pre-feed-forward one `ffn_norm` (Llama's second norm)
GEMMA_LAYER_NAMES = LAYER_NAMES | {
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm"}
# llama.cpp permutes q/k rows for these architectures only
PERMUTED_ARCHITECTURES = ("llama",)


def read_gguf_config(path: str | Path) -> ModelConfig:
    """The `ModelConfig` of the GGUF file `path`, from its metadata, named after the file."""
    gguf = open_gguf(path)
    return hf_config_to_model_config(gguf_to_hf_config(gguf), name=Path(path).name.removesuffix(".gguf"))


def hf_name(gguf_name: str, architecture: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor name of `architecture` (None for a name it does not have)."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    layer_names = GEMMA_LAYER_NAMES if architecture in GEMMA_ARCHITECTURES else LAYER_NAMES
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
    return None


class GGUFTensors:
    """A GGUF file's tensors under their Hugging Face names, dequantized to float32 on `get`."""

    def __init__(self, gguf: GGUFFile, config: ModelConfig):
        """Map every tensor; ValueError naming any tensor of an unsupported type or an unknown name."""
        self._gguf, self._config = gguf, config
        unsupported = sorted({gguf.tensor_type(n) for n in gguf.tensor_names()} - set(SUPPORTED_TENSOR_TYPES))
        if unsupported:
            raise ValueError(f"{gguf.path}: unsupported GGUF tensor type(s) {unsupported}; "
                             f"supported: {list(SUPPORTED_TENSOR_TYPES)}")
        arch = gguf.architecture
        unknown = sorted(n for n in gguf.tensor_names() if hf_name(n, arch) is None)
        if unknown:
            raise ValueError(f"{gguf.path}: tensors no {arch} model has: {unknown[:8]}")
        self._by_hf_name = {hf_name(n, arch): n for n in gguf.tensor_names()}
        self._permuted = arch in PERMUTED_ARCHITECTURES
        self._norms_offset = arch in GEMMA_ARCHITECTURES

    def names(self) -> set[str]:
        """Every tensor's Hugging Face name."""
        return set(self._by_hf_name)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor `name` in Hugging Face layout (`[out, in]` for a Linear weight)."""
        return self._gguf.tensor_shape(self._by_hf_name[name])

    def get(self, name: str) -> np.ndarray:
        """Tensor `name` dequantized to float32, q/k rows back in Hugging Face order, Gemma norms as `w` again
        (llama.cpp stores Gemma's `1 + w`)."""
        tensor = dequantized(self._gguf, self._by_hf_name[name])
        if self._norms_offset and name.endswith("norm.weight"):
            return tensor - 1.0
        if self._permuted and ".self_attn.q_proj." in name:
            tensor = unpermute_rope_rows(tensor, self._config.num_heads)
        elif self._permuted and ".self_attn.k_proj." in name:
            tensor = unpermute_rope_rows(tensor, self._config.num_kv_heads)
        return tensor


def dequantized(gguf: GGUFFile, name: str) -> np.ndarray:
    """GGUF tensor `name` as float32 in numpy order, dequantized by llama.cpp's `gguf` package."""
    from gguf import dequantize

    data, qtype = gguf.raw_tensor(name)
    return np.asarray(dequantize(data, qtype), dtype=np.float32).reshape(gguf.tensor_shape(name))


def unpermute_rope_rows(tensor: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: per head, rows `(x0, y0, x1, y1, ...)` back to `(x0, x1, ..., y0, y1, ...)`.

    llama.cpp rotates adjacent pairs (GPT-J style); Hugging Face rotates the two halves of a head.
    """
    half = tensor.shape[0] // num_heads // 2
    pairs = tensor.reshape(num_heads, half, 2, *tensor.shape[1:])
    return np.ascontiguousarray(pairs.swapaxes(1, 2).reshape(tensor.shape))


def check_gguf_checkpoint(path: str | Path) -> ModelConfig:
    """The `ModelConfig` of the GGUF file `path` once its metadata and tensor list are checked, nothing dequantized.

    Raises the `ValueError` loading would (not a GGUF file, an unsupported
    architecture or tensor type, a missing, unexpected or mis-shaped tensor),
    so a command can refuse the file before it starts anything.
    """
    path = Path(path)
    gguf = open_gguf(path)
    config = read_gguf_config(path)
    _check_tensors(path, config, tensor_mappings(config), abstract_params(config, config.dtype),
                   GGUFTensors(gguf, config))
    return config


def load_gguf_checkpoint(path: str | Path, dtype=None, sharding_of: ShardingOf | None = None) -> DecoderModel:
    """Load the GGUF file `path` into a `DecoderModel`, every tensor dequantized and cast to `dtype`.

    `dtype` defaults to the file's float type when every matrix has one, else
    float32. Raises `ValueError` naming an unsupported architecture, tensor
    type, or a missing, unexpected or mis-shaped tensor before any weight is
    dequantized. `sharding_of` places each weight's slices on their devices.
    """
    path = Path(path)
    gguf = open_gguf(path)
    config = read_gguf_config(path)
    dtype = dtype or config.dtype
    tensors = GGUFTensors(gguf, config)
    mappings = tensor_mappings(config)
    _check_tensors(path, config, mappings, abstract_params(config, dtype), tensors)
    params = {m.path: _to_flax(tensors.get(m.hf_name), m) for m in mappings}
    return assemble_model(config, params, dtype, sharding_of)
