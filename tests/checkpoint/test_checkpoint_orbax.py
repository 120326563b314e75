"""Orbax save/load, the `load_model` dispatcher, and the HF -> Orbax conversion script."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.checkpoint import (convert_hf_to_orbax, is_orbax_checkpoint_dir, load_model,
                                 load_params, model_config, save_hf_checkpoint, save_params)
from jaxpaged.cli import main as cli
from jaxpaged.config import load_config
from jaxpaged.model import init_model

TOKENS = jnp.asarray([[1, 200, 33, 7, 7, 150, 64, 9]])


def logits(model) -> np.ndarray:
    return np.asarray(model.forward_dense(TOKENS))


def test_orbax_round_trip_gives_identical_logits(tmp_path, tiny_model):
    save_params(tiny_model, tmp_path / "ckpt")
    assert is_orbax_checkpoint_dir(tmp_path / "ckpt")
    restored = load_params(tmp_path / "ckpt")
    assert restored.config == tiny_model.config
    np.testing.assert_array_equal(logits(restored), logits(tiny_model))
    assert not np.array_equal(logits(init_model(tiny_model.config, seed=1)), logits(tiny_model))


def test_orbax_keeps_bfloat16_and_rope_scaling(tmp_path):
    config = load_config("tiny").replace(rope_scaling=load_config("llama3-8b").rope_scaling, tie_embeddings=True)
    model = init_model(config, seed=3, dtype="bfloat16")
    save_params(model, tmp_path / "ckpt")
    restored = load_params(tmp_path / "ckpt")
    assert restored.embed_tokens.embedding.dtype == jnp.bfloat16 and restored.lm_head is None
    assert restored.config.dtype == "bfloat16" and restored.config.rope_scaling == config.rope_scaling
    np.testing.assert_array_equal(np.asarray(restored.inv_freq[...]), np.asarray(model.inv_freq[...]))
    np.testing.assert_array_equal(logits(restored), logits(model))


def test_load_model_dispatch(tmp_path, tiny_model):
    by_name = load_model("tiny", seed=0)
    np.testing.assert_array_equal(logits(by_name), logits(tiny_model))
    assert load_model("tiny", dtype="bfloat16").config.dtype == "bfloat16"
    save_hf_checkpoint(tiny_model, tmp_path / "hf")
    save_params(tiny_model, tmp_path / "orbax")
    for kind in ("hf", "orbax"):
        np.testing.assert_array_equal(logits(load_model(tmp_path / kind)), logits(tiny_model))
    with pytest.raises(ValueError, match="neither"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="unknown model config"):
        load_model("no-such-config")


def test_model_config_reads_a_checkpoints_own_config_and_capacity_takes_a_directory(tmp_path, capsys):
    """Three layers and two KV heads, shapes no shipped config has: each checkpoint kind's own config comes back
    without its weights, and `jaxpaged capacity --model=DIR` (whose flag check accepts a directory) sizes
    the KV of those shapes."""
    config = load_config("tiny").replace(num_layers=3, num_kv_heads=2)
    model = init_model(config, seed=0)
    save_hf_checkpoint(model, tmp_path / "hf")
    save_params(model, tmp_path / "orbax")
    shapes = ("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size", "vocab_size")
    for kind in ("hf", "orbax"):
        got = model_config(tmp_path / kind)
        assert [getattr(got, f) for f in shapes] == [getattr(config, f) for f in shapes]
    assert model_config("tiny") == load_config("tiny")
    with pytest.raises(ValueError, match="neither"):
        model_config(tmp_path)
    assert cli.run(["jaxpaged", "capacity", f"--model={tmp_path / 'hf'}", "--budget_gb=1",
                    f"--json_out={tmp_path}/c.json"]) == 0, capsys.readouterr().err[-2000:]
    kv_bytes_per_token = 2 * 3 * 2 * config.head_dim * 2  # K and V, 3 layers, 2 KV heads, float16
    assert json.loads((tmp_path / "c.json").read_text())["bytes_per_token"] == kv_bytes_per_token


def test_convert_command_end_to_end(tmp_path, tiny_model):
    hf_dir, out_dir = tmp_path / "hf", tmp_path / "orbax"
    save_hf_checkpoint(tiny_model, hf_dir)
    (hf_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [257, 258]}))
    assert cli.run(["jaxpaged", "convert", f"--hf_dir={hf_dir}", f"--out_dir={out_dir}", "--dtype=bfloat16"]) == 0
    assert (out_dir / "generation_config.json").is_file()
    converted = load_model(out_dir)
    assert converted.embed_tokens.embedding.dtype == jnp.bfloat16
    expected = logits(load_model(hf_dir, dtype="bfloat16"))
    np.testing.assert_array_equal(logits(converted), expected)


def test_convert_library_keeps_float32(tmp_path, tiny_model):
    save_hf_checkpoint(tiny_model, tmp_path / "hf")
    convert_hf_to_orbax(tmp_path / "hf", tmp_path / "orbax")
    np.testing.assert_array_equal(logits(load_params(tmp_path / "orbax")), logits(tiny_model))


def test_save_refuses_to_overwrite_unless_asked(tmp_path, tiny_model):
    save_params(tiny_model, tmp_path / "ckpt")
    other = init_model(tiny_model.config, seed=5)
    with pytest.raises(ValueError, match="already exists"):
        save_params(other, tmp_path / "ckpt")
    save_params(other, tmp_path / "ckpt", overwrite=True)
    np.testing.assert_array_equal(logits(load_params(tmp_path / "ckpt")), logits(other))
