"""The tokenizer and chat template a GGUF file describes in its `tokenizer.*` metadata.

A GGUF carries no `tokenizer.json`: it stores the vocabulary, the BPE merges,
each token's type and the special ids under llama.cpp's keys. transformers'
GGUF tokenizer converter (`transformers.integrations.gguf`) is the reference;
three vocabulary kinds are built as it builds them:

- byte-level BPE (`tokenizer.ggml.model == "gpt2"`): a `tokenizers` BPE with
  the pre-tokenizer llama.cpp uses for the file's `tokenizer.ggml.pre`;
- sentencepiece BPE (`llama`: Llama 2, Mistral, TinyLlama): a BPE over
  `▁`-spelled pieces with byte fallback (`<0x41>` tokens), its merges from the
  file or, as llama.cpp files usually carry none, implied by the pieces' scores;
- Gemma's sentencepiece BPE (`llama` in a `gemma2` / `gemma3` file): its
  scores do not order its merges, the pieces' order in the file does; llama.cpp
  writes its whitespace-run pieces with real spaces, respelled here with `▁`;
  spaces become `▁` with no dummy prefix.

Then, for every kind, in one place (`add_special_tokens`, `add_bos_eos`):
control tokens are special (matched whole, skipped when decoding),
user-defined tokens of the vocabulary are matched whole, and BOS/EOS are added
as the file's `add_bos_token` / `add_eos_token` say (BOS by default for the
sentencepiece kinds, as llama.cpp and transformers do). Other vocabularies
(`t5`, ...), Gemma 1 files and unknown pre-tokenizers are refused naming them,
rather than tokenizing differently from the model's own tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxpaged.gguf_file import GGUFFile, open_gguf

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
# sentencepiece vocabularies whose merges follow the file's order, not the scores (transformers' gemma_tokenizer)
GEMMA_ARCHITECTURES = ("gemma2", "gemma3")
# Gemma 1: its architecture is not served, and transformers' GGUF loader (the reference) does not read it
REFUSED_SENTENCEPIECE_ARCHITECTURES = {"gemma": "Gemma 1 GGUF files are not served (weights or tokenizer)"}
SPACE_PIECE = "\u2581"  # sentencepiece's "▁"


def build_gguf_tokenizer(path: str | Path) -> tuple[Any, int | None, int | None, list[int]]:
    """The `tokenizers` tokenizer the GGUF file `path` describes, its BOS id, its EOS id and every id that ends
    a turn (EOS, EOT, EOM); ValueError for a vocabulary kind it does not build. `jaxpaged.tokenizer.
    load_gguf_tokenizer` puts them behind the `Tokenizer` protocol."""
    gguf = open_gguf(path)
    stops = [gguf.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
    return (build_tokenizer(gguf), gguf.get("tokenizer.ggml.bos_token_id"), gguf.get("tokenizer.ggml.eos_token_id"),
            [s for s in stops if s is not None])


def build_tokenizer(gguf: GGUFFile) -> Any:
    """A `tokenizers.Tokenizer` equal to the one the file's metadata describes (module docstring)."""
    kind = gguf.get("tokenizer.ggml.model")
    if kind == "llama" and gguf.architecture in REFUSED_SENTENCEPIECE_ARCHITECTURES:
        raise ValueError(f"{gguf.path}: GGUF tokenizer of architecture {gguf.architecture!r} is not built: "
                         f"{REFUSED_SENTENCEPIECE_ARCHITECTURES[gguf.architecture]}")
    if kind == "llama" and gguf.architecture in GEMMA_ARCHITECTURES:
        tokenizer = build_gemma_tokenizer(gguf)
    elif kind == "llama":
        tokenizer = build_sentencepiece_tokenizer(gguf)
    elif kind == "gpt2":
        tokenizer = build_byte_level_tokenizer(gguf)
    else:
        raise ValueError(f"{gguf.path}: GGUF tokenizer model {kind!r} is not supported for architecture "
                         f"{gguf.architecture!r}; built from GGUF metadata: byte-level BPE ('gpt2') and "
                         "sentencepiece BPE ('llama', Gemma's included)")
    add_special_tokens(tokenizer, gguf)
    add_bos_eos(tokenizer, gguf, bos_by_default=kind == "llama")
    return tokenizer


def build_byte_level_tokenizer(gguf: GGUFFile) -> Any:
    """The BPE model and pre-tokenizer of a byte-level vocabulary (`tokenizer.ggml.model == "gpt2"`)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

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
    return tokenizer


def build_sentencepiece_tokenizer(gguf: GGUFFile) -> Any:
    """The BPE model of a sentencepiece vocabulary (`tokenizer.ggml.model == "llama"`, not Gemma's).

    Text is spelled with `▁` for spaces and one `▁` in front (sentencepiece's dummy prefix, unless the
    file says `add_space_prefix = false`); pieces missing from the vocabulary fall back to their UTF-8
    bytes (`<0xNN>` tokens).
    """
    from tokenizers import decoders, pre_tokenizers

    tokens: list[str] = gguf.get("tokenizer.ggml.tokens")
    tokenizer = _byte_fallback_bpe(gguf, tokens, gguf.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
    add_prefix = gguf.get("tokenizer.ggml.add_space_prefix", True)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_PIECE, split=False,
                                                       prepend_scheme="first" if add_prefix else "never")
    steps = [decoders.Replace(SPACE_PIECE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1)] if add_prefix else []))
    return tokenizer


def build_gemma_tokenizer(gguf: GGUFFile) -> Any:
    """The BPE model of Gemma's sentencepiece vocabulary, as transformers' `gemma_tokenizer` builds it.

    llama.cpp writes Gemma's pieces made of spaces only (`▁▁`, ...) with real spaces: they are respelled
    with `▁` so that merges reach them. Merges come from the file or, when it has none, from the
    vocabulary, best first by the merged piece's position in the file (Gemma's scores do not order its
    merges). Spaces become `▁` (a normalizer), with no dummy prefix in front of the text.
    """
    from tokenizers import decoders, normalizers, pre_tokenizers

    tokens = [SPACE_PIECE * len(t) if " " in t and not t.strip() else t for t in gguf.get("tokenizer.ggml.tokens")]
    tokenizer = _byte_fallback_bpe(gguf, tokens, [-float(i) for i in range(len(tokens))])
    tokenizer.normalizer = normalizers.Replace(" ", SPACE_PIECE)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE_PIECE, " "), decoders.ByteFallback(),
                                           decoders.Fuse()])
    return tokenizer


def _byte_fallback_bpe(gguf: GGUFFile, tokens: list[str], scores: list[float]) -> Any:
    """A sentencepiece-style BPE over ``tokens``: the file's merges, or those ``scores`` imply; byte fallback."""
    from tokenizers import Tokenizer, models

    vocab = {token: i for i, token in enumerate(tokens)}
    if gguf.has("tokenizer.ggml.merges"):
        merges = [tuple(m.split(" ", 1)) for m in gguf.get("tokenizer.ggml.merges")]
    else:
        merges = merges_from_scores(tokens, scores)
    unk = gguf.get("tokenizer.ggml.unknown_token_id")
    return Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                                unk_token=tokens[unk] if unk is not None else None))


def add_special_tokens(tokenizer: Any, gguf: GGUFFile) -> None:
    """Control tokens and the file's BOS, EOS, unknown and padding tokens as special tokens (matched whole in
    text, skipped when decoding); user-defined tokens the model's vocabulary holds as plain added tokens
    (matched whole). A user-defined piece the builder respelled (Gemma's runs of spaces) is left to the
    model, as transformers leaves it."""
    from tokenizers import AddedToken

    tokens: list[str] = gguf.get("tokenizer.ggml.tokens")
    types = gguf.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    named = {gguf.get(f"tokenizer.ggml.{name}_token_id") for name in ("bos", "eos", "unknown", "padding")}
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for i, (t, kind) in enumerate(zip(tokens, types)) if kind == CONTROL or i in named])
    vocab = tokenizer.get_vocab()
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == USER_DEFINED and t in vocab])


def add_bos_eos(tokenizer: Any, gguf: GGUFFile, *, bos_by_default: bool) -> None:
    """BOS in front of (EOS after) every encoded text when the file's `add_bos_token` (`add_eos_token`) says so;
    without the key, BOS only for ``bos_by_default`` and EOS never. Laid out as transformers' tokenizers do."""
    from tokenizers import processors

    tokens: list[str] = gguf.get("tokenizer.ggml.tokens")

    def added(name: str, default: bool) -> tuple[str, int] | None:
        token_id = gguf.get(f"tokenizer.ggml.{name}_token_id")
        wanted = gguf.get(f"tokenizer.ggml.add_{name}_token", default)
        return (tokens[token_id], token_id) if wanted and token_id is not None else None

    bos, eos = added("bos", bos_by_default), added("eos", False)
    if bos is None and eos is None:
        return
    first, last = ([bos[0]] if bos else []), ([eos[0]] if eos else [])
    single = " ".join(first + ["$A"] + last)
    pair = " ".join([single] + [f"{t}:1" for t in first] + ["$B:1"] + [f"{t}:1" for t in last])
    specials = dict(t for t in (bos, eos) if t is not None)
    tokenizer.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                             special_tokens=list(specials.items()))


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """The BPE merges a sentencepiece vocabulary implies: every split of a piece into two pieces of the
    vocabulary, best first by the merged piece's score (sentencepiece merges the pair whose result scores
    highest), then by the longer left part; equal keys keep vocabulary order. A piece listed twice counts
    once, with its last id and score (as a dict built from the list keeps it)."""
    ids = {token: i for i, token in enumerate(tokens)}
    candidates = []
    for token, score in dict(zip(tokens, scores)).items():
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
