"""A byte-level BPE vocabulary of a real model's size, for measuring grammar masks without a checkpoint.

The cost of filling a token mask depends on the vocabulary's token trie, so
the host-overhead benchmark's constrained rows need a tokenizer as large as
the model's (128,256 ids for Llama 3). This one has the 256 byte tokens, then
random letter and digit runs of 2-8 characters (half with a leading space,
some behind JSON punctuation, as BPE vocabularies have), then one special
end-of-text token. It has no merges: it is for masks, not for encoding text.
"""

from __future__ import annotations

import functools

import numpy as np

from jaxpaged.tokenizer import HFTokenizer

_PUNCTUATION = ['":', '",', '{"', '"}', '],', '":"', '":[', '":{', ', "', '": ', "\n", "  ", "    "]
_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))


@functools.cache
def synthetic_bpe_tokenizer(vocab_size: int, seed: int = 0) -> HFTokenizer:
    """An `HFTokenizer` with `vocab_size` ids, the last one its EOS (built in seconds; cached)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}  # the 256 bytes
    rng = np.random.default_rng(seed)
    while len(vocab) < vocab_size - 1:
        word = "".join(rng.choice(_LETTERS, rng.integers(2, 9)))
        r = rng.random()
        if r < 0.5:
            word = " " + word
        elif r < 0.6:
            word = _PUNCTUATION[rng.integers(len(_PUNCTUATION))] + word
        vocab.setdefault(byte_level.pre_tokenize_str(word)[0][0], len(vocab))  # as byte-level BPE writes it
    vocab["<|eot|>"] = vocab_size - 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|eot|>", special=True)])
    return HFTokenizer(tok, None, vocab_size - 1)
