"""Gemma's sentencepiece vocabulary in a GGUF file (`tokenizer.ggml.model = "llama"` in a `gemma2` / `gemma3` file),
written by `gguf`'s writer as llama.cpp lays it out: pieces of spaces only stored with real spaces, scores that do
not order the merges, control and user-defined specials, byte pieces, a chat template. jaxpaged's tokenizer and
chat template built from the metadata give the ids and text of transformers' GGUF tokenizer on the same file."""

from __future__ import annotations

import random

import pytest

from jaxpaged.gguf_file import open_gguf
from jaxpaged.gguf_tokenizer import build_sentencepiece_tokenizer
from jaxpaged.tokenizer import load_gguf_tokenizer
from jaxpaged.server.chat import ChatTemplate

SP = "\u2581"
# Gemma's own template (its tokenizer_config.json), which llama.cpp copies into tokenizer.chat_template
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
# merges are learned in this order (the file's), while the scores below rank them the other way round
PIECES = ["at", f"{SP}t", "he", f"{SP}the", f"{SP}c", f"{SP}cat", "in", f"{SP}in", f"{SP}a", "an", f"{SP}an", "nd",
          f"{SP}and", f"{SP}h", f"{SP}hat", "er", f"{SP}s", f"{SP}sat", "\n\n", f"{SP}{SP}", "ca", f"{SP}ca",
          "ta", "ble", "<", ">"]
LETTERS = [SP, "\n", "\t"] + list("abcdefghijklmnopqrstuvwxyzTHEC.,!?'/")
USER_DEFINED_SPACES = ["  ", "   ", "    "]  # llama.cpp writes Gemma's `▁▁`.. user-defined pieces with spaces
TEXTS = ["the cat sat in the hat", " leading space", "two  spaces   three    four     five", "tabs\tand\nnew\n\nlines",
         "caté 中文 🙂", "<start_of_turn>user\nthe cat<end_of_turn>\n", "<bos>the<eos>", "<table>cat</table>",
         "", " ", "   ", "end  ", f"{SP}spelled{SP}", "<unused0> and <mask>", "<start_of_turn >",
         "<unk> <pad><eos>"]


def gemma_vocab() -> tuple[list[str], list[int]]:
    """The pieces and llama.cpp token types of a small vocabulary of Gemma's kind (module docstring)."""
    from gguf import TokenType

    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "<unused0>"]
    types = [TokenType.CONTROL, TokenType.CONTROL, TokenType.CONTROL, TokenType.UNKNOWN, TokenType.CONTROL,
             TokenType.USER_DEFINED, TokenType.CONTROL, TokenType.USER_DEFINED]
    tokens += [f"<0x{b:02X}>" for b in range(256)] + USER_DEFINED_SPACES + ["<table>", "</table>"]
    types += [TokenType.BYTE] * 256 + [TokenType.USER_DEFINED] * (len(USER_DEFINED_SPACES) + 2)
    tokens += LETTERS + PIECES
    types += [TokenType.NORMAL] * (len(LETTERS) + len(PIECES))
    return tokens, types


def add_gemma_vocab(writer, add_bos=None) -> None:
    """Write `gemma_vocab` with Gemma's special ids and chat template, as llama.cpp's converter does."""
    tokens, types = gemma_vocab()
    scores = [float(i) for i in range(len(tokens))]  # later pieces score higher: the wrong order for Gemma
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_pad_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_bos_token_id(2)
    writer.add_unk_token_id(3)
    writer.add_add_space_prefix(False)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.add_chat_template(GEMMA_TEMPLATE)


def _write_gemma_gguf(path, *, arch="gemma2", add_bos=None):
    from gguf import GGUFWriter

    writer = GGUFWriter(path, arch)
    add_gemma_vocab(writer, add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _random_texts(count: int, seed: int = 0) -> list[str]:
    """Strings over the vocabulary's letters, runs of spaces, newlines, tabs, accents, CJK, emoji and specials."""
    rng = random.Random(seed)
    parts = list("abcdehnst") + [" ", "  ", "   ", "\n", "\n\n", "\t", "é", "中", "🙂", "<start_of_turn>",
                                 "<end_of_turn>", "<table>", SP, "the", " cat", "and"]
    return ["".join(rng.choice(parts) for _ in range(rng.randrange(1, 16))) for _ in range(count)]


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    from transformers import AutoTokenizer

    path = _write_gemma_gguf(tmp_path_factory.mktemp("gemma") / "gemma.gguf")
    return path, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_gemma_gguf_tokenizer_equals_transformers(gemma_file):
    path, reference = gemma_file
    ours = load_gguf_tokenizer(path)
    for text in TEXTS + _random_texts(300):
        ids = ours.encode(text)
        assert ids == reference(text)["input_ids"], text
        assert ours.encode(text, add_special_tokens=False) == reference(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True), text
    assert ours.encode("the")[0] == 2  # BOS by default, as llama.cpp and transformers add it
    assert f"{SP}{SP}{SP}" in ours.backend.encode("a   b", add_special_tokens=False).tokens  # a respelled piece
    assert ours.backend.encode("中", add_special_tokens=False).tokens == ["<0xE4>", "<0xB8>", "<0xAD>"]


def test_merges_follow_the_files_order_not_the_scores(gemma_file):
    """The control: the same vocabulary merged by its scores (the plain sentencepiece rule) tokenizes
    differently, so the Gemma rule above is what matched transformers."""
    path, reference = gemma_file
    by_scores = build_sentencepiece_tokenizer(open_gguf(path))
    by_scores.add_special_tokens(["<bos>"])
    assert by_scores.encode("cat").tokens == ["ca", "t"]  # "ca" scores higher than "at"
    assert reference.tokenize("cat") == ["c", "at"]  # "at" comes first in the file
    assert load_gguf_tokenizer(path).backend.encode("cat", add_special_tokens=False).tokens == ["c", "at"]


def test_gemma_chat_template_from_the_gguf_gives_transformers_ids(gemma_file):
    path, reference = gemma_file
    ours, template = load_gguf_tokenizer(path), ChatTemplate.for_model(str(path))
    chat = [{"role": "user", "content": "the cat  sat\n"}, {"role": "assistant", "content": "and the hat"},
            {"role": "user", "content": "中文 🙂"}]
    expected = reference.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ours.encode(template.render(chat), add_special_tokens=False) == list(expected)
    assert ours.encode(template.render(chat), add_special_tokens=False)[:2] == [2, 5]  # <bos><start_of_turn>
    with pytest.raises(ValueError, match="System role not supported"):
        template.render([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])


def test_gemma3_without_bos(tmp_path):
    from transformers import AutoTokenizer

    path = _write_gemma_gguf(tmp_path / "gemma3.gguf", arch="gemma3", add_bos=False)
    ours = load_gguf_tokenizer(path)
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in TEXTS:
        assert ours.encode(text) == reference(text)["input_ids"], text
    assert ours.encode("the")[0] != 2


def test_gemma1_is_refused_naming_why(tmp_path):
    with pytest.raises(ValueError, match="architecture 'gemma' is not built: Gemma 1 GGUF files are not served"):
        load_gguf_tokenizer(_write_gemma_gguf(tmp_path / "gemma.gguf", arch="gemma"))


def test_a_gemma_gguf_converts_with_its_tokenizer_and_template(tmp_path, gemma_file):
    """What `jaxpaged convert`, `serve` and `LLM` read: a Gemma 2 GGUF with weights and this vocabulary passes
    the serve check, and its converted directory's tokenizer and template give transformers' ids."""
    from jaxpaged.checkpoint import check_gguf_checkpoint, model_config
    from jaxpaged.checkpoint.convert import convert_hf_to_orbax
    from jaxpaged.tokenizer import load_tokenizer
    from tests.checkpoint.gguf_files import write_gguf
    from tests.checkpoint.test_gguf_gemma import FAMILIES, SHAPES, _metadata, _random_gemma

    _, reference = gemma_file
    vocab_size = len(gemma_vocab()[0])
    model = _random_gemma("gemma2", seed=3, vocab_size=vocab_size, bos_token_id=2, eos_token_id=1)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    hf = SHAPES | {"num_hidden_layers": 2, "rope_theta": FAMILIES["gemma2"][2]["rope_theta"],
                   "model_type": "gemma2", "vocab_size": vocab_size}
    path = write_gguf(tmp_path / "gemma2.gguf", hf, weights, arch="gemma2", extra=_metadata("gemma2"),
                      add_vocab=add_gemma_vocab)
    check_gguf_checkpoint(path)
    out = convert_hf_to_orbax(path, tmp_path / "converted")
    chat = [{"role": "user", "content": "the  cat\n中"}]
    expected = list(reference.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    for source in (path, out):
        tokenizer = load_tokenizer(source, model_config(path))
        for text in TEXTS:
            assert tokenizer.encode(text) == reference(text)["input_ids"], (source, text)
        prompt = ChatTemplate.for_model(str(source)).render(chat)
        assert tokenizer.encode(prompt, add_special_tokens=False) == expected, source
