"""Tokenizers and streaming detokenization, byte-level and Hugging Face `tokenizers`."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTok
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from jaxpaged.config import load_config
from jaxpaged.tokenizer import (ByteTokenizer, HFTokenizer, IncrementalDetokenizer, Tokenizer,
                                load_tokenizer)

TEXT = "héllo 世界 🙂 ok"
TRAINING_TEXT = ["hello world", "héllo there", "the quick brown fox", "hello hello world"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A directory with a byte-level BPE tokenizer.json trained here, plus configs naming EOS ids."""
    tok = HFTok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<eot>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    path = tmp_path_factory.mktemp("hf_tok")
    tok.save(str(path / "tokenizer.json"))
    (path / "config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    return path


def stream(tokenizer, ids) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer)
    chunks = [detok.push(i) for i in ids]
    chunks.append(detok.flush())
    assert detok.text == "".join(chunks)
    return chunks


# --- ByteTokenizer -------------------------------------------------------------------------------

def test_byte_tokenizer_round_trip_and_specials():
    tok = ByteTokenizer()
    ids = tok.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8")) and len(ids) > len(TEXT)
    assert tok.encode("a", add_special_tokens=True) == [256, 97]
    assert tok.decode(ids) == TEXT
    assert tok.decode([256, 104, 105, 257]) == "hi"
    assert tok.decode([256, 104, 105, 257, 300], skip_special_tokens=False) == "<|bos|>hi<|eos|><|300|>"
    assert tok.decode([0xE4, 0xB8, 104]) == "\ufffdh"  # truncated 3-byte sequence, then "h"
    assert isinstance(tok, Tokenizer)


def test_byte_detokenizer_emits_each_character_when_complete():
    tok = ByteTokenizer()
    chunks = stream(tok, tok.encode("é世🙂"))
    # é is 2 bytes, 世 3, 🙂 4: each appears on its last byte, nothing before.
    assert chunks == ["", "é", "", "", "世", "", "", "", "🙂", ""]


def test_byte_detokenizer_full_text_skips_eos_and_flushes_partial():
    tok = ByteTokenizer()
    chunks = stream(tok, tok.encode(TEXT) + [257])
    assert "".join(chunks) == TEXT
    assert not any("\ufffd" in c for c in chunks)
    truncated = stream(tok, tok.encode("ab") + [0xF0, 0x9F])  # half an emoji at the end of the stream
    assert truncated[-1] == "\ufffd" and "".join(truncated) == "ab\ufffd"


# --- HFTokenizer ---------------------------------------------------------------------------------

def test_hf_tokenizer_streams_multibyte_text_without_splitting(hf_dir):
    tok = load_tokenizer(hf_dir, load_config("tiny"))
    assert isinstance(tok, HFTokenizer) and isinstance(tok, Tokenizer)
    ids = tok.encode(TEXT)
    assert ids[0] == tok.bos_token_id == 0
    assert tok.decode(ids) == TEXT
    # The test must exercise hold-back: some token prefix ends inside a multi-byte character.
    assert any(tok.decode(ids[:k]).endswith("\ufffd") for k in range(1, len(ids)))
    chunks = stream(tok, ids + [tok.eos_token_id])
    assert "".join(chunks) == TEXT
    assert not any("\ufffd" in c for c in chunks)
    assert chunks.count("") > 0  # held back at least once


def test_hf_special_ids_and_stop_set(hf_dir):
    tok = load_tokenizer(hf_dir, load_config("tiny"))
    assert tok.eos_token_id == 1 and tok.stop_token_ids == {1, 2}
    vocab = json.loads((hf_dir / "tokenizer.json").read_text())["model"]["vocab"]
    assert tok.vocab_size == max(vocab.values()) + 1
    assert tok.encode("hello", add_special_tokens=False)[0] != 0
    assert tok.decode([0, *tok.encode("hello", add_special_tokens=False)], skip_special_tokens=False) == "<s>hello"


def test_eos_from_tokenizer_config_when_configs_lack_it(tmp_path, hf_dir):
    (tmp_path / "tokenizer.json").write_text((hf_dir / "tokenizer.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "<eot>"}}))
    tok = load_tokenizer(tmp_path, load_config("tiny"))
    assert (tok.bos_token_id, tok.eos_token_id, tok.stop_token_ids) == (0, 2, {2})


# --- load_tokenizer fallback ---------------------------------------------------------------------

def test_load_tokenizer_falls_back_to_bytes(tmp_path):
    config = load_config("tiny")
    for model_dir in (None, tmp_path):
        tok = load_tokenizer(model_dir, config)
        assert isinstance(tok, ByteTokenizer)
        assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (256, 257, 272)
        assert tok.stop_token_ids == {257}


def test_streaming_keeps_sentencepiece_style_spaces():
    """Metaspace decoders drop a token's leading space when it is decoded alone; streaming must not."""
    tok = HFTok(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(["hello world", "the quick brown fox", "hello there world"],
                            trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<s>", "</s>"]))
    wrapped = HFTokenizer(tok, bos_token_id=1, eos_token_id=2)
    ids = wrapped.encode("hello the world fox")
    assert "".join(wrapped.decode([i]) for i in ids) == "hellotheworldfox"  # why the window is needed
    assert "".join(stream(wrapped, ids)) == "hello the world fox"
