"""Every supported family against transformers on the same random-weight checkpoint.

transformers is the independent reference: each family's checkpoint is made
by its transformers class (`save_pretrained`), jaxpaged loads the directory
as a user would, and

- the dense no-cache forward gives transformers' logits on prompts several
  windows long (W = 32, 100+ tokens), where a window that was off by one,
  or ignored, would show; transformers' full-attention logits differ there;
- the paged engine's greedy tokens equal transformers' `generate`, and its
  logprobs equal transformers' log-softmax, through prefix hits, chunked
  prefill and preemption, on a NaN-filled pool;
- the paged runner equals the dense reference through chunked steps.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from jaxpaged.checkpoint import load_model, read_hf_config
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.runner import ModelRunner
from jaxpaged.sampling_params import SamplingParams
from tests.model.hf_families import FAMILIES, VOCAB, WINDOW
from tests.paged_driver import dense_logits, drive

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None
                                or importlib.util.find_spec("transformers") is None,
                                reason="torch/transformers missing: pip install -e '.[hf]'")

ENGINE_FAMILIES = ["mistral", "qwen2", "qwen3", "gemma3"]  # llama's engine parity is tests/bench's
MAX_TOKENS = 10
CHUNK_BUDGET = 64  # max_num_batched_tokens: the longest prompt needs three chunks


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family name -> (directory, transformers model), built on first use."""
    made = {}

    def get(name):
        if name not in made:
            path = tmp_path_factory.mktemp(name) / "ckpt"
            made[name] = (path, FAMILIES[name].save(path, seed=7))
        return made[name]

    return get


def hf_logits(model, tokens) -> np.ndarray:
    import torch
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].double().numpy()


def hf_generate(model, prompt) -> tuple[list[int], np.ndarray]:
    """transformers' greedy tokens and the log-softmax rows they were picked from."""
    import torch
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    tokens = out.sequences[0, len(prompt):].tolist()
    rows = torch.log_softmax(torch.cat(out.logits).double(), dim=-1).numpy()
    return tokens, rows


def prompts(seed: int) -> list[list[int]]:
    """Four prompts 12-130 tokens long; two share a 72-token prefix (nine blocks of 8)."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(3, VOCAB, 72).tolist()
    tails = [rng.integers(3, VOCAB, n).tolist() for n in (58, 30, 40, 12)]
    return [shared + t if i % 2 == 0 else t for i, t in enumerate(tails)]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_dense_logits_match_transformers_past_the_window(checkpoints, name):
    path, hf_model = checkpoints(name)
    model = load_model(path)
    assert model.config.model_type == hf_model.config.model_type
    assert model.config.num_params() == sum(p.numel() for p in hf_model.parameters())  # capacity math
    tokens = np.random.default_rng(1).integers(0, VOCAB, 4 * WINDOW - 5).tolist()
    expected = hf_logits(hf_model, tokens)
    got = dense_logits(model, tokens)
    np.testing.assert_allclose(got, expected, atol=2e-4 * np.abs(expected).max(), rtol=1e-4)
    if any(w is not None for w in model.config.layer_windows):
        assert set(model.config.layer_windows) >= {WINDOW}
        hf_model.config.sliding_window = 10 ** 6  # the same weights attending to everything
        try:
            full = hf_logits(hf_model, tokens)
        finally:
            hf_model.config.sliding_window = WINDOW
        assert np.abs(full[WINDOW:] - expected[WINDOW:]).max() > 1e-2  # the window matters here
        np.testing.assert_allclose(full[:WINDOW], expected[:WINDOW], atol=1e-4 * np.abs(expected).max())


def _num_blocks(path) -> int:
    """24 blocks' worth of KV bytes of every layer: with KV cache groups a block holds only a group's layers."""
    from jaxpaged.cache.kv_groups import kv_cache_layout
    config = read_hf_config(path)
    return 24 * config.num_layers // kv_cache_layout(config.layer_windows).num_tensors


@pytest.mark.parametrize("name", ENGINE_FAMILIES)
def test_engine_greedy_and_logprobs_match_transformers(checkpoints, name):
    """Prefix hits, chunked prefill and preemption (24 blocks for 4 prompts of up to 18 blocks), NaN pool."""
    path, hf_model = checkpoints(name)
    batch = prompts(seed=len(name))
    assert max(map(len, batch)) > 2 * CHUNK_BUDGET
    engine = Engine(EngineConfig(model=str(path), block_size=8, num_blocks=_num_blocks(path), max_num_seqs=4,
                                 max_num_batched_tokens=CHUNK_BUDGET, pool_fill_value=float("nan")))
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    for i, prompt in enumerate(batch):
        engine.add_request(f"r{i}", prompt, params)
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o.outputs[0] for o in engine.step() if o.finished})
    assert engine.kv.stats.prefix_hits_tokens >= 72 - 8
    # With every layer sliding (Mistral) a growing sequence frees about as many blocks as it takes, so
    # only admission waits for blocks and nothing is preempted; any full-attention group makes it preempt.
    all_sliding = None not in engine.model_config.layer_windows
    assert all_sliding or engine.scheduler.num_preemptions > 0
    assert engine.kv.stats.num_free_blocks == engine.num_blocks  # nothing leaks
    for i, prompt in enumerate(batch):
        out = finals[f"r{i}"]
        tokens, rows = hf_generate(hf_model, prompt)
        assert out.token_ids == tokens, f"request {i}"
        got = np.array([lp[t] for lp, t in zip(out.logprobs, tokens)])
        np.testing.assert_allclose(got, rows[np.arange(MAX_TOKENS), tokens], atol=2e-3)


@pytest.mark.parametrize("name", ["gemma3"])
def test_paged_runner_equals_dense_reference(checkpoints, name):
    """Chunks of 20 across blocks of 4 and the window edge, beside decodes, random block tables."""
    path, _ = checkpoints(name)
    model = load_model(path)
    rng = np.random.default_rng(3)
    runner = ModelRunner(model, num_blocks=128, block_size=4, pool_fill_value=float("nan"))
    seqs = drive(runner, [rng.integers(0, VOCAB, n).tolist() for n in (70, 9)], max_new=4, chunk=20, rng=rng)
    for s in seqs:
        dense = dense_logits(model, s.tokens[:-1])
        for pos, row in s.logits.items():
            np.testing.assert_allclose(row, dense[pos], atol=2e-4 * np.abs(dense).max(), rtol=1e-4)
        assert s.tokens[len(s.prompt):] == [int(np.argmax(dense[p]))
                                            for p in range(len(s.prompt) - 1, len(s.tokens) - 1)]


def test_hf_config_of_each_family_reads_back(checkpoints):
    """The written config.json of each family reads as the config jaxpaged wrote it from (and HF reads it)."""
    import transformers
    from jaxpaged.checkpoint.hf_config import model_config_to_hf_config
    for name in ("qwen2", "gemma3"):
        path, hf_model = checkpoints(name)
        config = read_hf_config(path)
        written = model_config_to_hf_config(config)
        hf_config = transformers.AutoConfig.for_model(written.pop("model_type"), **written)
        assert list(hf_config.layer_types) == list(hf_model.config.layer_types)
        assert hf_config.sliding_window == WINDOW


def test_multimodal_gemma3_loads_its_language_model(tmp_path):
    """Gemma3ForConditionalGeneration (the 4B-27B layout): the text model loads, vision weights skipped,
    under the Hub's tensor names (which transformers 5 still writes) and transformers 5's module names."""
    from safetensors.numpy import load_file, save_file
    from tests.model.hf_families import save_multimodal_gemma3
    hf_model = save_multimodal_gemma3(tmp_path / "v5", seed=3)
    tokens = np.random.default_rng(2).integers(3, VOCAB, 3 * WINDOW).tolist()
    expected = hf_logits(hf_model, tokens)
    model = load_model(tmp_path / "v5")
    assert model.config.model_type == "gemma3_text" and model.config.attention_windows == (None, WINDOW)
    np.testing.assert_allclose(dense_logits(model, tokens), expected, atol=2e-4 * np.abs(expected).max(), rtol=1e-4)
    tensors = load_file(tmp_path / "v5" / "model.safetensors")
    assert any(name.startswith("vision_tower.") for name in tensors)
    modules = tmp_path / "modules"  # the names of transformers 5's modules: model.language_model.*, ...
    modules.mkdir()
    (modules / "config.json").write_text((tmp_path / "v5" / "config.json").read_text())
    renamed = {"model." + name.replace("language_model.model.", "language_model."): t
               for name, t in tensors.items()}
    assert "model.language_model.embed_tokens.weight" in renamed and "model.vision_tower" in "".join(renamed)
    save_file(renamed, modules / "model.safetensors", metadata={"format": "pt"})
    np.testing.assert_array_equal(dense_logits(load_model(modules), tokens), dense_logits(model, tokens))
