"""Checkpoints without a tokenizer, with a sentencepiece one, and with bad config fields."""

import json

import pytest

from jaxpaged.checkpoint import hf_config_to_model_config, save_hf_checkpoint
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.model import init_model
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.tokenizer import IdsOnlyTokenizer, SentencePieceTokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
PROMPT = [5, 9, 14, 3, 77]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_config):
    """A Hugging Face directory whose BOS/EOS are 1 and 2 (transformers' defaults), with no tokenizer."""
    model = init_model(tiny_config.replace(bos_token_id=1, eos_token_id=2), seed=0)
    path = tmp_path_factory.mktemp("hf") / "model"
    save_hf_checkpoint(model, path)
    return path, model


def _engine(path, model):
    return Engine(EngineConfig(model=str(path), block_size=4, num_blocks=32), model=model)


def _drain(engine):
    outs = {}
    while engine.has_unfinished_requests():
        outs.update((o.request_id, o) for o in engine.step())
    return outs


def test_checkpoint_without_tokenizer_serves_token_ids_with_empty_text(checkpoint):
    path, model = checkpoint
    engine = _engine(path, model)
    engine.add_request("ids", PROMPT, GREEDY)
    out = _drain(engine)["ids"]
    assert isinstance(engine.tokenizer, IdsOnlyTokenizer)
    assert len(out.outputs[0].token_ids) == 4 and out.outputs[0].text == ""
    reference = Engine(EngineConfig(model="tiny", block_size=4, num_blocks=32), model=model)
    reference.add_request("ids", PROMPT, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                         detokenize=False))
    assert _drain(reference)["ids"].outputs[0].token_ids == out.outputs[0].token_ids
    with pytest.raises(ValueError, match="no tokenizer .* pass prompt token ids"):
        engine.add_request("text", "hello", GREEDY)
    assert engine.eos_token_ids == frozenset({2})


def test_sentencepiece_tokenizer_model_loads(tmp_path, checkpoint):
    sentencepiece = pytest.importorskip("sentencepiece")
    path, model = checkpoint
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    directory = tmp_path / "sp"
    directory.mkdir()
    for name in ("config.json", "model.safetensors"):
        (directory / name).write_bytes((path / name).read_bytes())
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(directory / "tokenizer"),
                                             vocab_size=40, model_type="char", bos_id=1, eos_id=2,
                                             unk_id=0, pad_id=-1, minloglevel=2)
    engine = _engine(directory, model)
    assert isinstance(engine.tokenizer, SentencePieceTokenizer)
    ids = engine.tokenizer.encode("the lazy fox")
    assert ids[0] == 1 and engine.tokenizer.decode(ids) == "the lazy fox"
    engine.add_request("text", "the lazy fox", GREEDY)
    out = _drain(engine)["text"]
    assert out.prompt_token_ids == ids and len(out.outputs[0].token_ids) == 4
    assert out.outputs[0].text == engine.tokenizer.decode(out.outputs[0].token_ids)


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "intermediate_size"])
def test_missing_config_field_is_named(checkpoint, key):
    hf = json.loads((checkpoint[0] / "config.json").read_text())
    del hf[key]
    with pytest.raises(ValueError, match=f"config.json lacks {key}"):
        hf_config_to_model_config(hf)


@pytest.mark.parametrize("dtype", ["int8", "float64", "float8_e4m3fn"])
def test_unsupported_torch_dtype_is_named(checkpoint, dtype):
    hf = json.loads((checkpoint[0] / "config.json").read_text())
    hf["torch_dtype"] = dtype
    with pytest.raises(ValueError, match=f"unsupported torch_dtype '{dtype}'"):
        hf_config_to_model_config(hf)
