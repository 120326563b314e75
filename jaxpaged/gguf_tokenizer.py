"""The tokenizer and chat template a GGUF file describes in its `tokenizer.*` metadata.

A GGUF carries no `tokenizer.json`: it stores the vocabulary, the BPE merges,
each token's type and the special ids under llama.cpp's keys. A byte-level BPE
vocabulary (`tokenizer.ggml.model == "gpt2"`) becomes a Hugging Face
`tokenizers` BPE with the pre-tokenizer llama.cpp uses for the file's
`tokenizer.ggml.pre`; control tokens are special (matched whole, skipped when
decoding). A sentencepiece BPE vocabulary (`llama`: Llama 2, Mistral, TinyLlama)
becomes a BPE over `▁`-spelled pieces with byte fallback (`<0x41>` tokens),
its merges from the file or, as llama.cpp files usually carry none, implied by
the pieces' scores. Other vocabularies (Gemma's sentencepiece, whose scores do
not order its merges, `t5`, ...) and unknown pre-tokenizers are refused naming
them, rather than tokenizing differently from the model's own tokenizer.
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
# Gemma's sentencepiece scores do not follow its merge order, and it spells runs of spaces differently
SENTENCEPIECE_REFUSED_ARCHITECTURES = ("gemma", "gemma2", "gemma3")
SPACE_PIECE = "\u2581"  # sentencepiece's "▁"


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
    if kind == "llama" and gguf.architecture not in SENTENCEPIECE_REFUSED_ARCHITECTURES:
        return build_sentencepiece_tokenizer(gguf)
    if kind != "gpt2":
        raise ValueError(f"{gguf.path}: GGUF tokenizer model {kind!r} is not supported for architecture "
                         f"{gguf.architecture!r}; built from GGUF metadata: byte-level BPE ('gpt2') and "
                         "sentencepiece BPE ('llama', but not Gemma's)")
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


def build_sentencepiece_tokenizer(gguf: GGUFFile) -> Any:
    """A `tokenizers.Tokenizer` for a sentencepiece BPE vocabulary (`tokenizer.ggml.model == "llama"`).

    Text is spelled with `▁` for spaces and one `▁` in front (sentencepiece's dummy prefix); pieces
    missing from the vocabulary fall back to their UTF-8 bytes (`<0xNN>` tokens). BOS is added unless the
    file says `add_bos_token = false` (llama.cpp's default for this kind of vocabulary).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens: list[str] = gguf.get("tokenizer.ggml.tokens")
    vocab = {token: i for i, token in enumerate(tokens)}
    if gguf.has("tokenizer.ggml.merges"):
        merges = [tuple(m.split(" ", 1)) for m in gguf.get("tokenizer.ggml.merges")]
    else:
        merges = merges_from_scores(tokens, gguf.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
    unk = gguf.get("tokenizer.ggml.unknown_token_id")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                                     unk_token=tokens[unk] if unk is not None else None))
    add_prefix = gguf.get("tokenizer.ggml.add_space_prefix", True)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_PIECE, split=False,
                                                       prepend_scheme="first" if add_prefix else "never")
    steps = [decoders.Replace(SPACE_PIECE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1)] if add_prefix else []))
    types = gguf.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == USER_DEFINED])
    bos = gguf.get("tokenizer.ggml.bos_token_id")
    if gguf.get("tokenizer.ggml.add_bos_token", True) and bos is not None:
        bos_text = tokens[bos]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos_text} $A", pair=f"{bos_text} $A {bos_text} $B", special_tokens=[(bos_text, bos)])
    return tokenizer


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """The BPE merges a sentencepiece vocabulary implies: every split of a piece into two pieces of the
    vocabulary, best first by the merged piece's score (sentencepiece merges the pair whose result scores
    highest), then by the longer left part; equal keys keep vocabulary order."""
    ids = {token: i for i, token in enumerate(tokens)}
    candidates = []
    for token, score in zip(tokens, scores):
        splits = [(token[:cut], token[cut:]) for cut in range(1, len(token))
                  if token[:cut] in ids and token[cut:] in ids]
        splits.sort(key=lambda pair: (ids[pair[0]], ids[pair[1]]))
        candidates += [(left, right, score) for left, right in splits]
    candidates.sort(key=lambda c: (c[2], len(c[0]), len(c[1])), reverse=True)
    return [(left, right) for left, right, _ in candidates]


def gguf_chat_template(path: str | Path) -> tuple[str | None, str, str]:
    """`(template, bos text, eos text)` from the file's `tokenizer.chat_template` (None when it has none)."""
    gguf = open_gguf(path)
    tokens = gguf.get("tokenizer.ggml.tokens") or []

    def text(key: str) -> str:
        token_id = gguf.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[token_id] if token_id is not None and token_id < len(tokens) else ""

    return gguf.get("tokenizer.chat_template"), text("bos"), text("eos")
