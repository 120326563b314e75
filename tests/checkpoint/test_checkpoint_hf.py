"""Hugging Face checkpoint loading, checked against an independent numpy Llama.

Each test writes its own tiny checkpoint with HF tensor names and `[out, in]`
Linear weights, straight from numpy arrays (not through jaxpaged's writer), and
compares `forward_dense` of the loaded model with `numpy_llama_logits`, a
float64 forward written here from the raw arrays.
"""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxpaged.checkpoint import hf_config_to_model_config, load_hf_checkpoint, save_hf_checkpoint
from jaxpaged.checkpoint.hf import is_hf_checkpoint_dir

TOKENS = np.array([[3, 17, 5, 42, 0, 9, 31, 8, 8, 27, 49, 1, 12, 33]])

BASE_HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 48, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "max_position_embeddings": 128,
    "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
}
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


# --- the checkpoint, written by hand -------------------------------------------------------------

def random_hf_weights(hf: dict, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights under HF names and shapes for config dict `hf`."""
    rng = np.random.default_rng(seed)
    h, inter, vocab = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    d = hf.get("head_dim") or h // hf["num_attention_heads"]
    nq, nkv = hf["num_attention_heads"] * d, hf["num_key_value_heads"] * d

    def linear(out_dim, in_dim):
        return rng.normal(0, in_dim ** -0.5, (out_dim, in_dim))

    def norm(dim):  # not all ones, so a swapped norm weight changes the logits
        return 1.0 + 0.2 * rng.normal(size=dim)

    w = {"model.embed_tokens.weight": rng.normal(0, 1.0, (vocab, h))}
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": norm(h),
              p + "self_attn.q_proj.weight": linear(nq, h),
              p + "self_attn.k_proj.weight": linear(nkv, h),
              p + "self_attn.v_proj.weight": linear(nkv, h),
              p + "self_attn.o_proj.weight": linear(h, nq),
              p + "post_attention_layernorm.weight": norm(h),
              p + "mlp.gate_proj.weight": linear(inter, h),
              p + "mlp.up_proj.weight": linear(inter, h),
              p + "mlp.down_proj.weight": linear(h, inter)}
    w["model.norm.weight"] = norm(h)
    if not hf["tie_word_embeddings"]:
        w["lm_head.weight"] = linear(vocab, h)
    return {k: v.astype(dtype) for k, v in w.items()}


def write_hf_dir(path, hf: dict, weights: dict[str, np.ndarray], num_shards: int = 1):
    """Write config.json and the weights; several shards plus an index when `num_shards > 1`."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf))
    if num_shards == 1:
        save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
        return path
    names = list(weights)
    weight_map = {}
    for k, chunk in enumerate(np.array_split(np.arange(len(names)), num_shards), start=1):
        fname = f"model-{k:05d}-of-{num_shards:05d}.safetensors"
        save_file({names[j]: weights[names[j]] for j in chunk}, path / fname)
        weight_map |= {names[j]: fname for j in chunk}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


# --- the independent reference -------------------------------------------------------------------

def reference_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    """Per-frequency RoPE, with Llama 3.1's three wavelength bands when `scaling` is given."""
    out = []
    for j in range(head_dim // 2):
        freq = theta ** (-2 * j / head_dim)
        if scaling:
            old = scaling["original_max_position_embeddings"]
            lo, hi, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
            wavelength = 2 * math.pi / freq
            if wavelength > old / lo:
                freq = freq / factor
            elif wavelength >= old / hi:
                s = (old / wavelength - lo) / (hi - lo)
                freq = (1 - s) * freq / factor + s * freq
        out.append(freq)
    return np.array(out)


def numpy_llama_logits(hf: dict, w: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """Llama forward for one sequence in float64: RMSNorm, rotate-half RoPE, GQA, SwiGLU."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    n_heads, n_kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    d = hf.get("head_dim") or hf["hidden_size"] // n_heads
    eps = hf["rms_norm_eps"]
    inv_freq = reference_inv_freq(d, hf["rope_theta"], hf.get("rope_scaling"))
    angles = np.arange(len(tokens))[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angles), np.sin(angles)

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def rope(x):  # x: [L, d]; pairs (j, j + d/2)
        a, b = x[:, : d // 2], x[:, d // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    x = w["model.embed_tokens.weight"][tokens]
    length = len(tokens)
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = h @ w[p + "self_attn.q_proj.weight"].T
        k = h @ w[p + "self_attn.k_proj.weight"].T
        v = h @ w[p + "self_attn.v_proj.weight"].T
        heads = []
        for head in range(n_heads):
            kv = head // (n_heads // n_kv)
            qh = rope(q[:, head * d:(head + 1) * d])
            kh = rope(k[:, kv * d:(kv + 1) * d])
            scores = qh @ kh.T / math.sqrt(d)
            scores[np.triu_indices(length, 1)] = -np.inf
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            heads.append(probs @ v[:, kv * d:(kv + 1) * d])
        x = x + np.concatenate(heads, axis=-1) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if hf["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def model_logits(model) -> np.ndarray:
    return np.asarray(model.forward_dense(jnp.asarray(TOKENS)))[0]


def assert_matches_reference(model, hf, weights):
    expected = numpy_llama_logits(hf, weights, TOKENS[0])
    np.testing.assert_allclose(model_logits(model), expected, rtol=2e-4, atol=2e-4)


# --- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_loaded_logits_match_numpy_reference(tmp_path, tied):
    hf = BASE_HF_CONFIG | {"tie_word_embeddings": tied}
    weights = random_hf_weights(hf)
    model = load_hf_checkpoint(write_hf_dir(tmp_path / "ckpt", hf, weights))
    assert (model.lm_head is None) == tied
    assert model.config.num_kv_heads == 2 and model.config.num_heads == 4
    assert_matches_reference(model, hf, weights)


def test_llama3_rope_scaling_and_explicit_head_dim(tmp_path):
    hf = BASE_HF_CONFIG | {"rope_scaling": LLAMA3_SCALING, "head_dim": 16, "rope_theta": 5000.0,
                           "rms_norm_eps": 1e-4}
    weights = random_hf_weights(hf, seed=1)
    model = load_hf_checkpoint(write_hf_dir(tmp_path / "ckpt", hf, weights))
    assert model.config.head_dim == 16 and model.config.rope_scaling.factor == 8.0
    assert_matches_reference(model, hf, weights)
    # The scaling must matter at these positions, or this test would prove nothing.
    unscaled = numpy_llama_logits(hf | {"rope_scaling": None}, weights, TOKENS[0])
    assert np.abs(model_logits(model) - unscaled).max() > 1e-2


def test_sharded_checkpoint_loads(tmp_path):
    weights = random_hf_weights(BASE_HF_CONFIG, seed=2)
    path = write_hf_dir(tmp_path / "ckpt", BASE_HF_CONFIG, weights, num_shards=3)
    assert not (path / "model.safetensors").exists()
    assert_matches_reference(load_hf_checkpoint(path), BASE_HF_CONFIG, weights)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_weights_load(tmp_path, dtype):
    hf = BASE_HF_CONFIG | {"torch_dtype": dtype}
    weights = random_hf_weights(hf, seed=3, dtype=NP_DTYPES[dtype])
    path = write_hf_dir(tmp_path / "ckpt", hf, weights)
    native = load_hf_checkpoint(path)  # default: the checkpoint's torch_dtype
    assert native.embed_tokens.embedding.dtype == jnp.dtype(dtype)
    assert native.config.dtype == dtype
    np.testing.assert_array_equal(np.asarray(native.embed_tokens.embedding[...]),
                                  weights["model.embed_tokens.weight"])
    upcast = load_hf_checkpoint(path, dtype="float32")
    assert upcast.config.dtype == "float32"
    assert_matches_reference(upcast, hf, weights)


def test_missing_tensor_is_named(tmp_path):
    weights = random_hf_weights(BASE_HF_CONFIG)
    del weights["model.layers.1.mlp.up_proj.weight"]
    path = write_hf_dir(tmp_path / "ckpt", BASE_HF_CONFIG, weights)
    with pytest.raises(ValueError, match=r"missing.*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_hf_checkpoint(path)


def test_misshaped_tensor_is_named_with_both_shapes(tmp_path):
    weights = random_hf_weights(BASE_HF_CONFIG)
    weights["model.layers.0.self_attn.k_proj.weight"] = np.zeros((32, 16), np.float32)  # transposed
    path = write_hf_dir(tmp_path / "ckpt", BASE_HF_CONFIG, weights)
    with pytest.raises(ValueError, match=r"k_proj\.weight.*\(32, 16\).*expected \(16, 32\)"):
        load_hf_checkpoint(path)


def test_unexpected_tensor_is_named_and_known_extras_ignored(tmp_path):
    weights = random_hf_weights(BASE_HF_CONFIG)
    extras = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}
    model = load_hf_checkpoint(write_hf_dir(tmp_path / "ok", BASE_HF_CONFIG, weights | extras))
    assert_matches_reference(model, BASE_HF_CONFIG, weights)
    bias = {"model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)}
    with pytest.raises(ValueError, match=r"unexpected.*q_proj\.bias"):
        load_hf_checkpoint(write_hf_dir(tmp_path / "bad", BASE_HF_CONFIG, weights | bias))


def test_tied_checkpoint_with_stray_lm_head_uses_embedding(tmp_path):
    hf = BASE_HF_CONFIG | {"tie_word_embeddings": True}
    weights = random_hf_weights(hf)
    stray = {"lm_head.weight": np.zeros((50, 32), np.float32)}
    model = load_hf_checkpoint(write_hf_dir(tmp_path / "ckpt", hf, weights | stray))
    assert_matches_reference(model, hf, weights)


def test_missing_shard_file_and_non_checkpoint_dir(tmp_path):
    weights = random_hf_weights(BASE_HF_CONFIG)
    path = write_hf_dir(tmp_path / "ckpt", BASE_HF_CONFIG, weights, num_shards=2)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="model-00002-of-00002"):
        load_hf_checkpoint(path)
    assert not is_hf_checkpoint_dir(tmp_path)
    with pytest.raises(ValueError, match="not a Hugging Face checkpoint"):
        load_hf_checkpoint(tmp_path)


@pytest.mark.parametrize("shard_size_bytes", [None, 20_000])
def test_writer_round_trip_in_hf_layout(tmp_path, tiny_model, shard_size_bytes):
    path = tmp_path / "out"
    save_hf_checkpoint(tiny_model, path, shard_size_bytes=shard_size_bytes)
    shards = sorted(path.glob("*.safetensors"))
    assert (len(shards) > 1) == (shard_size_bytes is not None)
    from safetensors.numpy import load_file
    raw = {k: v for f in shards for k, v in load_file(f).items()}
    assert raw["model.layers.0.self_attn.q_proj.weight"].shape == (64, 64)
    assert raw["model.layers.1.mlp.down_proj.weight"].shape == (64, 128)  # [out, in]
    assert raw["lm_head.weight"].shape == (272, 64)
    hf = json.loads((path / "config.json").read_text())
    # The written files are a valid HF checkpoint by the independent reference too.
    np.testing.assert_allclose(model_logits(load_hf_checkpoint(path)),
                               numpy_llama_logits(hf, raw, TOKENS[0]), rtol=2e-4, atol=2e-4)
    np.testing.assert_array_equal(model_logits(load_hf_checkpoint(path)), model_logits(tiny_model))


def test_hf_config_translation():
    config = hf_config_to_model_config(BASE_HF_CONFIG | {"num_key_value_heads": None,
                                                         "eos_token_id": [2, 7]})
    assert (config.num_kv_heads, config.head_dim, config.eos_token_id) == (4, 8, 2)
    old_key = hf_config_to_model_config(BASE_HF_CONFIG | {"rope_scaling": {
        **{k: v for k, v in LLAMA3_SCALING.items() if k != "rope_type"}, "type": "llama3"}})
    assert old_key.rope_scaling.original_max_position_embeddings == 64
    v5 = hf_config_to_model_config({k: v for k, v in BASE_HF_CONFIG.items() if k != "rope_theta"}
                                   | {"rope_parameters": {"rope_theta": 123.0, **LLAMA3_SCALING}})
    assert v5.rope_theta == 123.0 and v5.rope_scaling.factor == 8.0
    assert hf_config_to_model_config(BASE_HF_CONFIG | {"rope_scaling": {"rope_type": "default"}}).rope_scaling is None
    with pytest.raises(ValueError, match="yarn"):
        hf_config_to_model_config(BASE_HF_CONFIG | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="phi3"):
        hf_config_to_model_config(BASE_HF_CONFIG | {"model_type": "phi3"})
