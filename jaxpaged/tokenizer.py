"""Tokenizers: a byte-level fallback, a Hugging Face `tokenizer.json` wrapper, and streaming decode.

The engine depends only on the `Tokenizer` protocol. A GGUF file uses the
tokenizer its metadata describes (`jaxpaged.gguf_tokenizer`). A checkpoint directory
uses its `tokenizer.json` (Hugging Face `tokenizers`), else its
`tokenizer.model` (sentencepiece), else -- when its BOS/EOS ids lie below 256,
so bytes cannot be tokens -- no tokenizer at all (`IdsOnlyTokenizer`: token-id
prompts are served with empty output text, and a text prompt is refused with a
ValueError). The shipped random-weight configs use
`ByteTokenizer`: ids 0-255 are raw bytes, then BOS and EOS (256 and 257 in
configs/tiny.json).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Protocol, runtime_checkable

from jaxpaged.config import ModelConfig

REPLACEMENT_CHAR = "\ufffd"  # what UTF-8 decoding with errors="replace" yields for a partial character


@runtime_checkable
class Tokenizer(Protocol):
    """What the engine needs from a tokenizer."""

    bos_token_id: int | None
    eos_token_id: int | None
    stop_token_ids: frozenset[int]  # generation stops on any of these (EOS may be several ids)
    vocab_size: int
    # declared, never probed: the most characters one token covers when the tokenizer bounds it (a text
    # longer than this many times max_model_len cannot fit), else None
    max_chars_per_token: int | None
    # how structured output reads the vocabulary (`jaxpaged.structured.tokenizer_bridge`): "hf" (the
    # tokenizer.json), "bytes", "sentencepiece", or "none" (a checkpoint without a tokenizer)
    vocabulary_form: str

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with `add_special_tokens`, whatever the tokenizer adds around a text (BOS).

        Chat prompts are encoded without them: the chat template writes its own (vLLM's default).
        """
        ...

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; incomplete UTF-8 sequences become U+FFFD."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0-255 are bytes, `bos_token_id`/`eos_token_id` follow."""

    max_chars_per_token = 1  # every token covers at most one character: a text's tokens >= its length
    vocabulary_form = "bytes"

    def __init__(self, bos_token_id: int = 256, eos_token_id: int = 257, vocab_size: int = 258):
        if min(bos_token_id, eos_token_id) < 256 or max(bos_token_id, eos_token_id) >= vocab_size:
            raise ValueError(f"BOS/EOS ids ({bos_token_id}, {eos_token_id}) must lie in [256, {vocab_size})")
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.stop_token_ids = frozenset({eos_token_id})
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The UTF-8 bytes of `text`, preceded by BOS only when asked (`add_special_tokens`)."""
        return ([self.bos_token_id] if add_special_tokens else []) + list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Bytes decoded as UTF-8 (invalid sequences become U+FFFD).

        Ids above 255 are special (BOS, EOS, or unused vocabulary a random model may
        sample): dropped when `skip_special_tokens`, else shown as `<|bos|>`, `<|eos|>`, `<|id|>`.
        """
        pieces: list[str] = []
        run = bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            if skip_special_tokens:
                continue
            pieces.append(run.decode("utf-8", errors="replace"))
            run.clear()
            pieces.append(self._special_name(i))
        pieces.append(run.decode("utf-8", errors="replace"))
        return "".join(pieces)

    def _special_name(self, token_id: int) -> str:
        return {self.bos_token_id: "<|bos|>", self.eos_token_id: "<|eos|>"}.get(token_id, f"<|{token_id}|>")


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer (from `tokenizer.json`) behind the `Tokenizer` protocol."""

    max_chars_per_token = None
    vocabulary_form = "hf"

    def __init__(self, tokenizer: Any, bos_token_id: int | None, eos_token_id: int | None,
                 stop_token_ids: Iterable[int] = ()):
        self._tok = tokenizer
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        stops = set(stop_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
        self.stop_token_ids = frozenset(stops)
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "HFTokenizer":
        """Load `tokenizer.json` from `model_dir`, with BOS/EOS/stop ids from the configs beside it."""
        from tokenizers import Tokenizer as _Tokenizer  # heavy import, only for HF models

        model_dir = Path(model_dir)
        tok = _Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        bos, eos, stops = read_special_ids(model_dir, tok.token_to_id)
        return cls(tok, bos, eos, stops)

    @property
    def backend(self) -> Any:
        """The wrapped `tokenizers.Tokenizer`."""
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; the tokenizer's post-processor adds BOS when it is configured to."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`, by the tokenizer's own decoder."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


class SentencePieceTokenizer:
    """A sentencepiece `tokenizer.model` (Llama-2 style checkpoints) behind the `Tokenizer` protocol."""

    max_chars_per_token = None
    vocabulary_form = "sentencepiece"

    def __init__(self, processor: Any, bos_token_id: int | None, eos_token_id: int | None,
                 stop_token_ids: Iterable[int] = ()):
        self._sp = processor
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        stops = set(stop_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
        self.stop_token_ids = frozenset(stops)
        self.vocab_size = processor.get_piece_size()

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "SentencePieceTokenizer":
        """Load `tokenizer.model` from `model_dir`; BOS/EOS from the configs beside it, else the model's own."""
        try:
            import sentencepiece
        except ImportError:
            raise ValueError(f"{model_dir} has a sentencepiece tokenizer.model: "
                             "pip install sentencepiece to load it") from None
        processor = sentencepiece.SentencePieceProcessor(model_file=str(Path(model_dir) / "tokenizer.model"))
        bos, eos, stops = read_special_ids(Path(model_dir), lambda piece: processor.piece_to_id(piece))
        own = lambda i: i if i >= 0 else None  # sentencepiece reports -1 for an absent special
        return cls(processor, own(processor.bos_id()) if bos is None else bos,
                   own(processor.eos_id()) if eos is None else eos, stops)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, preceded by BOS (as Llama's sentencepiece tokenizer does) when it has one."""
        ids = self._sp.encode(text)
        return ([self.bos_token_id] if add_special_tokens and self.bos_token_id is not None else []) + ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids` (ids outside the sentencepiece vocabulary are dropped)."""
        size = self.vocab_size
        return self._sp.decode([i for i in ids if 0 <= i < size and not (skip_special_tokens and
                                                                          self._sp.is_control(i))])


class IdsOnlyTokenizer:
    """A checkpoint without a tokenizer: token ids in and out, output text always empty.

    `can_encode` is False, so the engine refuses text prompts with a ValueError.
    """

    can_encode = False
    max_chars_per_token = None
    vocabulary_form = "none"

    def __init__(self, bos_token_id: int | None, eos_token_id: int | None, vocab_size: int,
                 stop_token_ids: Iterable[int] = ()):
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        stops = set(stop_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
        self.stop_token_ids = frozenset(stops)
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Always a ValueError: there is no tokenizer to encode text with."""
        raise ValueError("this model has no tokenizer (no tokenizer.json or tokenizer.model): "
                         "pass prompt token ids instead of text")

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Empty: without a tokenizer, outputs are token ids only."""
        return ""


def read_special_ids(model_dir: Path, token_to_id=None) -> tuple[int | None, int | None, set[int]]:
    """(bos, eos, stop ids) for a model directory.

    Stop ids are the union of `eos_token_id` in generation_config.json and
    config.json (each an int or a list). BOS/EOS prefer config.json, then
    generation_config.json, then the token strings of tokenizer_config.json.
    """
    configs = [_read_json(model_dir / name) for name in ("config.json", "generation_config.json")]
    stops: set[int] = set()
    for cfg in configs:
        stops |= set(_as_list(cfg.get("eos_token_id")))
    tok_cfg = _read_json(model_dir / "tokenizer_config.json")

    def pick(key: str) -> int | None:
        for cfg in configs:
            found = _as_list(cfg.get(f"{key}_id"))
            if found:
                return found[0]
        token = tok_cfg.get(key)
        if isinstance(token, dict):  # {"content": "<|eot_id|>", ...} in older exports
            token = token.get("content")
        return token_to_id(token) if token and token_to_id else None

    bos, eos = pick("bos_token"), pick("eos_token")
    if eos is not None:
        stops.add(eos)
    return bos, eos, stops


def load_gguf_tokenizer(path: str | Path) -> HFTokenizer:
    """The `Tokenizer` of the GGUF file `path`, built from its metadata (`jaxpaged.gguf_tokenizer`); ValueError
    for a vocabulary kind it does not build."""
    from jaxpaged.gguf_tokenizer import build_gguf_tokenizer

    return HFTokenizer(*build_gguf_tokenizer(path))


def load_tokenizer(model_dir: str | Path | None, config: ModelConfig) -> Tokenizer:
    """The tokenizer for a model.

    A GGUF file's own (built from its metadata); a directory's `tokenizer.json` (`HFTokenizer`), else its `tokenizer.model`
    (`SentencePieceTokenizer`), else `IdsOnlyTokenizer` -- unless its BOS/EOS
    leave ids 0-255 free, as a shipped config saved as a checkpoint does: that
    and a shipped config name get a `ByteTokenizer` sized to `config`.
    """
    from jaxpaged.gguf_file import is_gguf_file

    if model_dir is not None and is_gguf_file(model_dir):
        return load_gguf_tokenizer(model_dir)
    if model_dir is not None and Path(model_dir).is_dir():
        model_dir = Path(model_dir)
        if (model_dir / "tokenizer.json").is_file():
            return HFTokenizer.from_dir(model_dir)
        if (model_dir / "tokenizer.model").is_file():
            return SentencePieceTokenizer.from_dir(model_dir)
        if not _byte_ids_free(config):
            bos, eos, stops = read_special_ids(model_dir)
            return IdsOnlyTokenizer(config.bos_token_id if bos is None else bos,
                                    config.eos_token_id if eos is None else eos, config.vocab_size, stops)
    bos = 256 if config.bos_token_id is None else config.bos_token_id
    eos = 257 if config.eos_token_id is None else config.eos_token_id
    return ByteTokenizer(bos, eos, vocab_size=max(config.vocab_size, bos + 1, eos + 1))


class IncrementalDetokenizer:
    """Streams text as tokens arrive, never emitting half of a multi-byte character.

    Each push decodes a short window: the tokens since the last emission
    (`_read`) plus the tokens before them back to the previous emission
    (`_prefix`), which give the decoder context (e.g. sentencepiece's leading
    spaces). The new text is the window's text minus the prefix's text; it is
    held back while it ends in U+FFFD, i.e. while a character is incomplete.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # everything emitted so far
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (often "", sometimes several characters)."""
        self.ids.append(token_id)
        new = self._pending()
        if not new or new.endswith(REPLACEMENT_CHAR):
            return ""
        return self._emit(new)

    def flush(self) -> str:
        """At the end of the stream: emit whatever is held back, U+FFFD included."""
        return self._emit(self._pending()) if self._read < len(self.ids) else ""

    def _pending(self) -> str:
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        before = decode(self.ids[self._prefix:self._read])
        window = decode(self.ids[self._prefix:])
        return window[len(before):] if len(window) > len(before) else ""

    def _emit(self, new: str) -> str:
        self._prefix, self._read = self._read, len(self.ids)
        self.text += new
        return new


def _byte_ids_free(config: ModelConfig) -> bool:
    """Whether the model's BOS/EOS leave ids 0-255 to bytes (as the shipped configs do)."""
    special = [i for i in (config.bos_token_id, config.eos_token_id) if i is not None]
    return config.vocab_size >= 258 and all(i >= 256 for i in special)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _as_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]
