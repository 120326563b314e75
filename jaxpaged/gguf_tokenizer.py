"""The tokenizer and chat template a GGUF file describes in its `tokenizer.*` metadata.

A GGUF carries no `tokenizer.json`: it stores the vocabulary, the BPE merges,
each token's type and the special ids under llama.cpp's keys. A byte-level BPE
vocabulary (`tokenizer.ggml.model == "gpt2"`) becomes a Hugging Face
`tokenizers` BPE with the pre-tokenizer llama.cpp uses for the file's
`tokenizer.ggml.pre`; control tokens are special (matched whole, skipped when
decoding). Other vocabularies (sentencepiece `llama`, `t5`, ...) and unknown
pre-tokenizers are refused naming them, rather than tokenizing differently
from the model's own tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxpaged.gguf_file import GGUFFile, open_gguf
from jaxpaged.tokenizer import HFTokenizer

# llama.cpp's split regexes (llama-vocab.cpp), by `tokenizer.ggml.pre`; None: GPT-2's own regex (ByteLevel's).
GPT2_REGEX_DIGITS_SPLIT = ("smollm", "starcoder", "refact", "command-r", "codeshell")
GPT2_REGEX = ("gpt2", "default", "mpt", "olmo")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
REGEX_SPLITS = {"llama3": LLAMA3_SPLIT, "llama-v3": LLAMA3_SPLIT, "llama-bpe": LLAMA3_SPLIT,
                "qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT}
SUPPORTED_PRE_TOKENIZERS = GPT2_REGEX_DIGITS_SPLIT + GPT2_REGEX + tuple(REGEX_SPLITS)
CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types


def load_gguf_tokenizer(path: str | Path) -> HFTokenizer:
    """The `Tokenizer` of the GGUF file `path`; ValueError for a vocabulary kind it does not build."""
    gguf = open_gguf(path)
    tokenizer = build_tokenizer(gguf)
    stops = [gguf.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
    return HFTokenizer(tokenizer, gguf.get("tokenizer.ggml.bos_token_id"), gguf.get("tokenizer.ggml.eos_token_id"),
                       [s for s in stops if s is not None])


def build_tokenizer(gguf: GGUFFile) -> Any:
    """A `tokenizers.Tokenizer` equal to the one the file's metadata describes."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = gguf.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{gguf.path}: GGUF tokenizer model {kind!r} is not supported; only byte-level BPE "
                         "('gpt2') is built from GGUF metadata")
    pre = gguf.get("tokenizer.ggml.pre", "default")
    if pre not in SUPPORTED_PRE_TOKENIZERS:
        raise ValueError(f"{gguf.path}: GGUF pre-tokenizer {pre!r} is not supported; "
                         f"supported: {sorted(SUPPORTED_PRE_TOKENIZERS)}")
    tokens: list[str] = gguf.get("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in gguf.get("tokenizer.ggml.merges", [])]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    if pre in REGEX_SPLITS:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(REGEX_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in GPT2_REGEX_DIGITS_SPLIT:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    types = gguf.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == USER_DEFINED])
    bos = gguf.get("tokenizer.ggml.bos_token_id")
    if gguf.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        bos_text = tokens[bos]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos_text} $A", pair=f"{bos_text} $A {bos_text} $B", special_tokens=[(bos_text, bos)])
    return tokenizer


def gguf_chat_template(path: str | Path) -> tuple[str | None, str, str]:
    """`(template, bos text, eos text)` from the file's `tokenizer.chat_template` (None when it has none)."""
    gguf = open_gguf(path)
    tokens = gguf.get("tokenizer.ggml.tokens") or []

    def text(key: str) -> str:
        token_id = gguf.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[token_id] if token_id is not None and token_id < len(tokens) else ""

    return gguf.get("tokenizer.chat_template"), text("bos"), text("eos")
