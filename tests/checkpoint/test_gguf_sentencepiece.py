"""A sentencepiece BPE vocabulary in a GGUF file (`tokenizer.ggml.model = "llama"`, as Llama 2, Mistral and
TinyLlama files carry it), written by `gguf`'s writer: jaxpaged's tokenizer built from the metadata gives the
ids and text of transformers' GGUF tokenizer on the same file, merges implied by the scores (llama.cpp files
carry none) and byte fallback for what the pieces cannot spell."""

from __future__ import annotations

import pytest

from jaxpaged.gguf_tokenizer import merges_from_scores
from jaxpaged.tokenizer import load_gguf_tokenizer

SP = "\u2581"
# pieces with scores: a higher score merges first, as sentencepiece's BPE does
PIECES = {f"{SP}t": -1.0, "he": -2.0, f"{SP}the": -3.0, f"{SP}a": -4.0, "in": -5.0, f"{SP}c": -6.0, "at": -7.0,
          f"{SP}cat": -8.0, f"{SP}s": -9.0, "at{SP}": -10.0, f"{SP}in": -11.0, "er": -12.0, f"{SP}h": -13.0,
          "at" + "s": -14.0, f"{SP}{SP}": -15.0, "an": -16.0, f"{SP}an": -17.0, "d": -18.0, f"{SP}and": -19.0}
LETTERS = [SP] + list("abcdefghijklmnopqrstuvwxyzTHEC.,!?'")
TEXTS = ["the cat sat in the hat", "The Cat and the hat!", "  two  spaces and\na newline", "caté 中文 🙂",
         "<|im_start|>the cat<|im_end|>", "", "the"]


def _write_sentencepiece_gguf(path, *, add_bos: bool | None):
    from gguf import GGUFWriter, TokenType

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["<|im_start|>", "<|im_end|>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    types += [TokenType.CONTROL, TokenType.CONTROL]
    scores = [0.0] * len(tokens)
    for letter in LETTERS:
        tokens.append(letter)
        types.append(TokenType.NORMAL)
        scores.append(-100.0 - len(tokens))
    for piece, score in PIECES.items():
        tokens.append(piece)
        types.append(TokenType.NORMAL)
        scores.append(score)
    writer = GGUFWriter(path, "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("add_bos", [None, False], ids=["bos-by-default", "no-bos"])
def test_sentencepiece_gguf_tokenizer_equals_transformers(tmp_path, add_bos):
    from transformers import AutoTokenizer

    path = _write_sentencepiece_gguf(tmp_path / "spm.gguf", add_bos=add_bos)
    ours = load_gguf_tokenizer(path)
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == reference(text)["input_ids"], text
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True), text
    assert (ours.encode("the cat")[0] == 1) == (add_bos is None)
    pieces = ours.backend.encode("the cat", add_special_tokens=False).tokens
    assert pieces == [f"{SP}the", f"{SP}cat"]  # merged, not spelled letter by letter
    assert ours.backend.encode("中", add_special_tokens=False).tokens == [SP, "<0xE4>", "<0xB8>", "<0xAD>"]


def test_merges_follow_the_merged_pieces_scores():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0]
    assert merges_from_scores(tokens, scores) == [("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]
