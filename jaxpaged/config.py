"""Model configuration: a frozen dataclass loaded from `configs/<name>.json`.

Configs are files so that benchmarks, tests and capacity math all read the same
numbers. `llama3-8b`, `llama3-70b`, `qwen3-8b`, `mistral-7b` and `gemma-3-27b`
are shape-only: they carry the real architecture for capacity planning and
random-weight GPU runs.

One decoder serves every family (Llama, Mistral, Qwen2/2.5, Qwen3, Gemma 3 text);
what differs between them is a field here, named after the Hugging Face option
it mirrors, never a separate model class.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

# tokens per KV block unless `EngineConfig.block_size` says otherwise (vLLM's default too); library
# defaults that need a block size (capacity math, cost models, simulator scenarios) all read this one
DEFAULT_BLOCK_SIZE = 16


ROPE_SCALING_TYPES = ("llama3", "linear")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling, as HF's `rope_scaling`: `llama3` (three wavelength bands) or `linear`.

    `linear` (Gemma 3's global layers) divides every frequency by `factor`; the
    band fields are then unused.
    """

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    rope_type: str = "llama3"

    def __post_init__(self):
        if self.rope_type not in ROPE_SCALING_TYPES:
            raise ValueError(f"rope_scaling.rope_type {self.rope_type!r} is not implemented; "
                             f"use one of {ROPE_SCALING_TYPES}")
        if self.factor <= 0:
            raise ValueError(f"rope_scaling.factor must be positive, got {self.factor}")
        if self.rope_type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"rope_scaling.high_freq_factor ({self.high_freq_factor}) must exceed "
                             f"low_freq_factor ({self.low_freq_factor})")


MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text")
HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh", "gelu")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder of the Llama family (Llama, Mistral, Qwen2, Qwen3, Gemma 3 text)."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    max_position_embeddings: int = 8192
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Sliding-window attention, as Hugging Face configs spell it: `layer_types[i]` is
    # "full_attention" or "sliding_attention"; a sliding layer's query at position p
    # sees keys p - sliding_window + 1 .. p. A `sliding_window` with no `layer_types`
    # makes every layer sliding (Mistral); neither means every layer is full (Llama).
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    # Per-family differences (defaults: Llama). `model_type` is the HF name the
    # checkpoint writer emits; the fields below decide the math.
    model_type: str = "llama"
    qkv_bias: bool = False  # q/k/v projections have biases (Qwen2; Llama/Qwen3 `attention_bias`)
    o_bias: bool = False  # the output projection has a bias (Llama/Qwen3 `attention_bias`)
    qk_norm: bool = False  # RMSNorm over head_dim on each q and k head, before RoPE (Qwen3, Gemma 3)
    norm_unit_offset: bool = False  # every RMSNorm scales by (1 + w), computed in float32 (Gemma)
    scale_embeddings: bool = False  # embeddings times sqrt(hidden_size), in the weights' dtype (Gemma)
    hidden_act: str = "silu"  # the gate's activation: SwiGLU (silu) or GeGLU (gelu_pytorch_tanh, gelu)
    sandwich_norms: bool = False  # norms after attention and around the MLP (Gemma's four per layer)
    query_pre_attn_scalar: float | None = None  # softmax scale is its -1/2 power (Gemma); else head_dim's
    final_logit_softcapping: float | None = None  # logits become cap * tanh(logits / cap)
    attn_logit_softcapping: float | None = None  # attention scores become cap * tanh(scores / cap) (Gemma 2)
    rope_local_theta: float | None = None  # RoPE base of sliding layers, unscaled (Gemma 3); None: rope_theta

    def __post_init__(self):
        for field in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                      "num_kv_heads", "head_dim", "intermediate_size"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive or None, got {self.sliding_window}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries; num_layers is {self.num_layers}")
            unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if unknown:
                raise ValueError(f"layer_types: unsupported attention type(s) {unknown}; use {LAYER_TYPES}")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not implemented; use one of {MODEL_TYPES}")
        if self.hidden_act not in HIDDEN_ACTS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not implemented; use one of {HIDDEN_ACTS}")
        for field in ("query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping",
                      "rope_local_theta"):
            value = getattr(self, field)
            if value is not None and not value > 0:
                raise ValueError(f"{field} must be positive or None, got {value}")

    def layer_window(self, layer: int) -> int | None:
        """Sliding window of layer `layer` in tokens, or None for full attention."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def attn_scale(self) -> float:
        """Softmax scale of the attention scores: `query_pre_attn_scalar ** -0.5`, else `head_dim ** -0.5`."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window (None: full attention), in layer order."""
        return tuple(self.layer_window(i) for i in range(self.num_layers))

    @property
    def attention_windows(self) -> tuple[int | None, ...]:
        """The distinct attention types, one per KV cache group: full (None) first, then windows ascending."""
        windows = set(self.layer_windows)
        return ((None,) if None in windows else ()) + tuple(sorted(w for w in windows if w is not None))

    @property
    def q_per_kv(self) -> int:
        """Query heads sharing one KV head (the GQA group size)."""
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, kv_dtype: str | None = None) -> int:
        """Bytes of K and V, over all layers, that one token occupies in the cache."""
        itemsize = dtype_itemsize(kv_dtype or self.dtype)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    def check_tensor_parallel(self, size: int) -> None:
        """Raise ValueError unless `size` devices split this model (whole heads, KV heads, MLP, vocabulary).

        KV heads split when `size` divides them and are replicated (vLLM's rule) when
        `size` is a multiple of them; any other size fits neither way.
        """
        if size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
        if size == 1:
            return
        if self.num_heads % size:
            raise ValueError(f"tensor_parallel_size={size} must divide the model's num_heads "
                             f"({self.num_heads}) so each device holds whole query heads")
        kv = self.num_kv_heads
        if kv % size and size % kv:
            raise ValueError(f"tensor_parallel_size={size} must divide num_kv_heads ({kv}) or be a "
                             f"multiple of it (KV heads are then replicated); {size} is neither")
        if self.intermediate_size % size:
            raise ValueError(f"tensor_parallel_size={size} must divide intermediate_size "
                             f"({self.intermediate_size})")

    def kv_shards(self, tensor_parallel_size: int) -> int:
        """Distinct slices of the KV pool over `tensor_parallel_size` devices (each device holds one).

        `tensor_parallel_size` when it divides the KV heads; `num_kv_heads` when the
        heads are replicated, so a device then holds one KV head: 1/num_kv_heads of the pool.
        """
        return min(tensor_parallel_size, self.num_kv_heads)

    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied; biases and every norm included)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = h * q * 2 + h * kv * 2
        attn += (q + 2 * kv) * self.qkv_bias + h * self.o_bias + 2 * self.head_dim * self.qk_norm
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + (4 if self.sandwich_norms else 2) * h
        embed = self.vocab_size * h * (1 if self.tie_embeddings else 2)
        return self.num_layers * per_layer + embed + h

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Build from a plain dict (as stored in configs/*.json); an unknown key is a ValueError naming it."""
        d = dict(d)
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown model config field(s) {unknown}: not implemented")
        if d.get("rope_scaling") is not None:
            d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
        if d.get("layer_types") is not None:
            d["layer_types"] = tuple(d["layer_types"])
        return cls(**d)

    def to_dict(self) -> dict:
        """Plain-dict form, the inverse of `from_dict`."""
        return dataclasses.asdict(self)


LAYER_TYPES = ("full_attention", "sliding_attention")

DTYPE_ALIASES = {"fp8_e4m3": "float8_e4m3fn", "fp8": "float8_e4m3fn", "bf16": "bfloat16",
                 "fp16": "float16", "fp32": "float32"}
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn")


def canonical_dtype_name(dtype: str) -> str:
    """Resolve a user-facing dtype name (`fp16`, `bf16`, `fp8_e4m3`, ...) to its canonical name."""
    name = DTYPE_ALIASES.get(dtype, dtype)
    if name not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; use one of {SUPPORTED_DTYPES} "
                         f"or an alias {tuple(DTYPE_ALIASES)}")
    return name


def dtype_itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name (aliases accepted)."""
    name = canonical_dtype_name(dtype)
    if name in ("bfloat16", "float8_e4m3fn"):
        import ml_dtypes  # numpy knows these dtypes through ml_dtypes (a JAX dependency)
        return np.dtype(getattr(ml_dtypes, name)).itemsize
    return np.dtype(name).itemsize


def list_configs() -> list[str]:
    """Names of the configs shipped in `configs/`."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def load_config(name_or_path: str | Path) -> ModelConfig:
    """Load a config by name (`tiny`, `small`, `llama3-8b`, ...) or from a JSON path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / f"{name_or_path}.json"
    if not path.exists():
        raise ValueError(f"unknown model config {name_or_path!r}; shipped configs: {list_configs()}")
    return ModelConfig.from_dict(json.loads(path.read_text()))
