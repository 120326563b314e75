"""llguidance's view of the project's tokenizers: each token id's bytes, built once per tokenizer and cached.

llguidance computes a token mask from every token's byte string (its
"token trie"), so the bridge lists the bytes of each id of the model's
vocabulary: raw bytes for `ByteTokenizer`, the Hugging Face `tokenizer.json`
itself for `HFTokenizer` (llguidance reads it natively), and sentencepiece
pieces (with U+2581 as a space and `<0xNN>` byte pieces as that byte) for
`SentencePieceTokenizer`. Ids past the tokenizer's vocabulary (a model's
padded embedding rows) are special tokens the mask never allows. Building one
takes up to about a second for a 128K vocabulary, so it is cached per
(tokenizer, vocabulary size).
"""

from __future__ import annotations

import threading
import weakref


SPM_SPACE = "\u2581"
_cache: "weakref.WeakKeyDictionary[object, dict[int, object]]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def ll_tokenizer(tokenizer, vocab_size: int):
    """The cached `llguidance.LLTokenizer` for `tokenizer` over a model vocabulary of `vocab_size` ids.

    EOS is every stop id of the tokenizer (a grammar that is complete allows
    them). ValueError for a tokenizer structured output cannot use (no tokenizer).
    """
    with _lock:
        per_size = _cache.setdefault(tokenizer, {})
        if vocab_size not in per_size:
            per_size[vocab_size] = _build(tokenizer, vocab_size)
        return per_size[vocab_size]


def _build(tokenizer, vocab_size: int):
    import llguidance

    eos = sorted(tokenizer.stop_token_ids) or None
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(f"structured output needs the tokenizer's vocabulary ({tokenizer.vocab_size} ids) to fit "
                         f"the model's ({vocab_size} logits)")
    form = tokenizer.vocabulary_form  # declared by every tokenizer (`jaxpaged.tokenizer.Tokenizer`)
    if form == "hf":
        return llguidance.LLTokenizer(tokenizer._tok.to_str(), n_vocab=vocab_size, eos_token=eos)
    if form == "bytes":
        tokens = [bytes([i]) for i in range(256)] + [b""] * (vocab_size - 256)
        special = list(range(256, vocab_size))
        wrapper = _Wrapper(tokens, special, tokenizer, lambda data: list(data))
    elif form == "sentencepiece":
        tokens, special = _sentencepiece_tokens(tokenizer._sp, vocab_size)
        # not sentencepiece's own encoder: it adds a leading space ("dummy prefix") that the bytes lack
        wrapper = _Wrapper(tokens, special, tokenizer, _GreedyEncoder(tokens, special))
    elif form == "none":
        raise ValueError("structured output needs a tokenizer: this model has none "
                         "(no tokenizer.json or tokenizer.model)")
    else:
        raise ValueError(f"structured output does not support tokenizers of vocabulary form {form!r}")
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapper), n_vocab=vocab_size, eos_token=eos)


class _Wrapper:
    """What `llguidance.TokenizerWrapper` reads: token bytes, special ids, EOS/BOS and an encoder of bytes."""

    def __init__(self, tokens: list[bytes], special: list[int], tokenizer, encode):
        self.tokens = tokens
        self.special_token_ids = special
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self._encode = encode

    def __call__(self, data: bytes) -> list[int]:
        return self._encode(data)


class _GreedyEncoder:
    """Bytes to token ids, longest known token first: llguidance tokenizes forced text (e.g. `{"`) with it."""

    def __init__(self, tokens: list[bytes], special: list[int]):
        skip = set(special)
        self._ids = {}
        for i, t in enumerate(tokens):
            if t and i not in skip:
                self._ids.setdefault(t, i)
        self._longest = max(map(len, self._ids), default=1)

    def __call__(self, data: bytes) -> list[int]:
        out, at = [], 0
        while at < len(data):
            for end in range(min(len(data), at + self._longest), at, -1):
                token = self._ids.get(data[at:end])
                if token is not None:
                    out.append(token)
                    at = end
                    break
            else:
                at += 1  # a byte no token holds (no byte fallback): llguidance never forces it
        return out


def _sentencepiece_tokens(sp, vocab_size: int) -> tuple[list[bytes], list[int]]:
    """Each id's bytes in a sentencepiece model, and the special (control, unknown, padding) ids."""
    tokens, special = [], []
    size = sp.get_piece_size()
    for i in range(vocab_size):
        if i >= size or sp.is_control(i) or sp.is_unknown(i):
            tokens.append(b"")
            special.append(i)
            continue
        piece = sp.id_to_piece(i)
        if sp.is_byte(i):  # "<0x0A>"
            tokens.append(bytes([int(piece[3:-1], 16)]))
        else:
            tokens.append(piece.replace(SPM_SPACE, " ").encode("utf-8"))
    return tokens, special
