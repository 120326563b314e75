"""GGUF loading: every supported ggml type dequantized as transformers' own torch dequantizers do, and tiny
random-weight models written as GGUF (llama.cpp's names and q/k permutation, by `gguf.GGUFWriter`) whose
logits equal the same weights read from a Hugging Face directory and an independent numpy forward.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxpaged.checkpoint import load_hf_checkpoint, load_model, model_config
from jaxpaged.checkpoint.gguf import SUPPORTED_TENSOR_TYPES, dequantized
from jaxpaged.gguf_file import open_gguf
from tests.checkpoint.gguf_files import write_gguf
from tests.checkpoint.test_checkpoint_hf import (BASE_HF_CONFIG, TOKENS, model_logits, numpy_llama_logits,
                                                 random_hf_weights, write_hf_dir)

ROWS, COLS = 4, 512  # two 256-element super-blocks per row for the K-quants
# K-quant block layouts (ggml-common.h): bytes per 256 values, offsets of the fp16 scales in a block
K_QUANT_BLOCKS = {"Q4_K": (144, (0, 2)), "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}


def _k_quant_blocks(qtype: str, rng) -> np.ndarray:
    """Random K-quant blocks with small finite fp16 scales (`gguf` has no K-quant quantizer)."""
    size, scale_offsets = K_QUANT_BLOCKS[qtype]
    blocks = rng.integers(0, 256, (ROWS * COLS // 256, size), dtype=np.uint8)
    for offset in scale_offsets:
        blocks[:, offset:offset + 2] = rng.uniform(0.001, 0.05, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(ROWS, -1)


@pytest.fixture(scope="module")
def typed_gguf(tmp_path_factory):
    """One GGUF holding a `ROWS x COLS` tensor per ggml type, and the float values each was made from."""
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("gguf") / "types.gguf"
    writer = GGUFWriter(path, "llama")
    originals = {}
    for qtype in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"):
        kind = GGMLQuantizationType[qtype]
        if qtype in K_QUANT_BLOCKS:
            writer.add_tensor(qtype, _k_quant_blocks(qtype, rng), raw_dtype=kind)
            continue
        values = rng.normal(0, 1, (ROWS, COLS)).astype(np.float32)
        originals[qtype] = values
        stored = {"F32": values, "F16": values.astype(np.float16)}.get(qtype)
        if stored is not None:
            writer.add_tensor(qtype, stored)
        else:
            writer.add_tensor(qtype, quants.quantize(values, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, originals


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"])
def test_quantized_tensor_matches_transformers_dequantizer(typed_gguf, qtype):
    import torch
    from gguf import GGMLQuantizationType
    from transformers.integrations.gguf.dequant import dequantize as transformers_dequantize

    path, _ = typed_gguf
    gguf = open_gguf(path)
    data, _ = gguf.raw_tensor(qtype)
    expected = transformers_dequantize(torch.from_numpy(np.array(data).reshape(-1)),
                                       int(GGMLQuantizationType[qtype])).numpy().reshape(ROWS, COLS)
    got = dequantized(gguf, qtype)
    assert got.shape == (ROWS, COLS) and np.isfinite(got).all() and np.abs(got).max() > 0
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("qtype, tolerance", [("F32", 0), ("F16", 1e-3), ("BF16", 1e-2), ("Q8_0", 0.03),
                                              ("Q4_0", 0.5), ("Q4_1", 0.5)])
def test_dequantized_tensor_is_close_to_what_was_written(typed_gguf, qtype, tolerance):
    path, originals = typed_gguf
    got = dequantized(open_gguf(path), qtype)
    error = np.abs(got - originals[qtype])
    assert error.max() <= tolerance * np.abs(originals[qtype]).max() + 1e-7
    if qtype != "F32":
        assert error.max() > 0  # the file really holds the lower-precision type


def test_supported_types_cover_the_issue_list():
    assert {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"} <= set(SUPPORTED_TENSOR_TYPES)


# --- whole models --------------------------------------------------------------------------------

@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_llama_gguf_logits_equal_the_hf_directory_and_numpy(tmp_path, tied):
    hf = BASE_HF_CONFIG | {"tie_word_embeddings": tied}
    weights = random_hf_weights(hf, seed=3)
    write_hf_dir(tmp_path / "hf", hf, weights)
    path = write_gguf(tmp_path / "tiny.gguf", hf, weights)
    config = model_config(path)
    assert (config.model_type, config.num_kv_heads, config.tie_embeddings) == ("llama", 2, tied)
    from_gguf = load_model(path)
    np.testing.assert_allclose(model_logits(from_gguf), model_logits(load_hf_checkpoint(tmp_path / "hf")),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(model_logits(from_gguf), numpy_llama_logits(hf, weights, TOKENS[0]),
                               rtol=2e-4, atol=2e-4)


def test_f16_gguf_serves_float16_and_matches_the_rounded_weights(tmp_path):
    hf = BASE_HF_CONFIG
    weights = random_hf_weights(hf, seed=4)
    path = write_gguf(tmp_path / "half.gguf", hf, weights, qtype_of=lambda name: "F16")
    assert model_config(path).dtype == "float16"
    rounded = {k: v.astype(np.float16).astype(np.float32) if v.ndim == 2 else v for k, v in weights.items()}
    model = load_model(path, dtype="float32")
    np.testing.assert_allclose(model_logits(model), numpy_llama_logits(hf, rounded, TOKENS[0]), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_gguf_logits_equal_transformers(tmp_path, family):
    """Qwen GGUFs keep Hugging Face's q/k row order, carry q/k/v biases (Qwen2) or q/k norms (Qwen3)."""
    import torch

    from tests.model.hf_families import COMMON, FAMILIES

    spec = FAMILIES[family]
    options = {k: v for k, v in spec.options.items() if "window" not in k and k != "layer_types"}
    model = type(spec)(family, spec.config_class, spec.model_class, options).build(seed=5)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    hf = COMMON | {"model_type": family, "rope_theta": model.config.rope_parameters["rope_theta"]}
    path = write_gguf(tmp_path / f"{family}.gguf", hf, weights)
    with torch.no_grad():
        expected = model(torch.from_numpy(TOKENS)).logits.numpy()[0]
    np.testing.assert_allclose(model_logits(load_model(path)), expected, rtol=2e-4, atol=2e-4)


def test_unsupported_architecture_and_tensor_type_are_refused_by_name(tmp_path):
    hf = BASE_HF_CONFIG
    weights = random_hf_weights(hf, seed=6)
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'falcon'"):
        model_config(write_gguf(tmp_path / "falcon.gguf", hf, weights, arch="falcon"))
    hf64 = hf | {"hidden_size": 64, "intermediate_size": 64}
    path = write_gguf(tmp_path / "q5.gguf", hf64, random_hf_weights(hf64, seed=6),
                      qtype_of=lambda name: "Q5_0" if "mlp" in name else "F32")
    load_model(path)  # Q5_0 is read
    hf256 = hf | {"hidden_size": 256, "intermediate_size": 256}  # ternary blocks hold 256 values
    path = write_gguf(tmp_path / "tq.gguf", hf256, random_hf_weights(hf256, seed=6),
                      qtype_of=lambda name: "TQ2_0" if "mlp.up_proj" in name else "F32")
    with pytest.raises(ValueError, match=r"unsupported GGUF tensor type\(s\) \['TQ2_0'\]"):
        load_model(path)


def test_missing_tensor_is_named(tmp_path):
    hf = BASE_HF_CONFIG
    weights = random_hf_weights(hf, seed=7)
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="missing tensors: .*model.layers.1.mlp.up_proj.weight"):
        load_model(write_gguf(tmp_path / "broken.gguf", hf, weights))


def test_not_a_gguf_file_is_not_taken_for_one(tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"not a gguf")
    with pytest.raises(ValueError):
        model_config(fake)


def test_convert_command_reads_a_gguf_file(tmp_path):
    from jaxpaged.cli import main as cli
    from jaxpaged.server.chat import ChatTemplate
    from jaxpaged.tokenizer import load_tokenizer

    hf = BASE_HF_CONFIG
    weights = random_hf_weights(hf, seed=8)
    template = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    path = write_gguf(tmp_path / "tiny.gguf", hf, weights, chat_template=template)
    out = tmp_path / "orbax"
    assert cli.run(["jaxpaged", "convert", f"--model={path}", f"--out_dir={out}"]) == 0
    np.testing.assert_array_equal(model_logits(load_model(out)), model_logits(load_model(path)))
    converted, original = load_tokenizer(out, model_config(out)), load_tokenizer(path, model_config(path))
    text = "<|im_start|>AB!(<|im_end|>"  # the vocabulary's pieces are "!" (id 3), '"', ... in byte order
    piece = lambda ch: 3 + ord(ch) - ord("!")
    assert converted.encode(text) == original.encode(text) == [1, piece("A"), piece("B"), 3, piece("("), 2]
    assert converted.stop_token_ids == original.stop_token_ids == {2}
    assert ChatTemplate.for_model(str(out)).render([{"role": "user", "content": "x"}]) == "<|im_start|>x<|im_end|>"
