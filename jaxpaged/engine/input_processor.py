"""Input processing: prompts in every accepted form become validated `Request`s.

A prompt is a string (tokenized), token ids (any iterable of integers), or a
dict with `prompt_token_ids` or `prompt` and optionally `cache_salt`. Bad input
raises ValueError naming what was wrong and the limit, before anything changes.
"""

from __future__ import annotations

import functools
import struct
from typing import Callable
from typing import Sequence as Seq

import numpy as np

from jaxpaged.config import ModelConfig
from jaxpaged.mathutils import cdiv, next_power_of_two, pow2_bucket
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.sequence import Request, Sequence
from jaxpaged.structured.grammar import compile_constraint
from jaxpaged.validation import INT32_MAX, check_int, check_optional_str

MAX_PRIORITY = INT32_MAX  # |priority| bound: any int32, as vLLM accepts


class InputProcessor:
    """Parses, tokenizes and validates prompts; builds requests with their sequences and stop ids."""

    def __init__(self, model_config: ModelConfig, *, max_model_len: int, num_blocks: int, block_size: int,
                 load_tokenizer: Callable[[], object], seed: int = 0,
                 blocks_for_tokens: Callable[[int], int] | None = None, computes_logits: bool = True,
                 samples_under_token_masks: bool = True, speculative: bool = False):
        """`load_tokenizer()` is called once, when the first string prompt or text output needs it.

        `computes_logits=False` (a simulated device, which samples a fixed token) refuses what needs
        real logits: prompt logprobs and beam search.

        `blocks_for_tokens(n)`: the most blocks one sequence of n tokens holds at once, when
        that is not `cdiv(n, block_size)` (KV cache groups: `KVCacheManager.max_blocks_for`).

        `speculative` (speculative decoding on) refuses a grammar (`structured_outputs`): its matcher
        would have to roll back with rejected drafts, which is not built yet.
        """
        self.speculative = speculative
        self.blocks_for_tokens = blocks_for_tokens
        self.computes_logits = computes_logits
        # a simulated device that draws constrained rows' tokens from their masks serves structured output
        self.samples_under_token_masks = samples_under_token_masks
        self.model_config = model_config
        self.max_model_len = max_model_len
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._load_tokenizer = load_tokenizer
        self._seed_rng = np.random.default_rng(seed)

    @functools.cached_property
    def tokenizer(self):
        """The tokenizer for string prompts and output text (bytes unless the checkpoint has one)."""
        return self._load_tokenizer()

    @functools.cached_property
    def eos_token_ids(self) -> frozenset[int]:
        """Tokens that end a sequence unless ignore_eos: the model's EOS plus the tokenizer's stop ids."""
        ids = set(self.tokenizer.stop_token_ids)
        if self.model_config.eos_token_id is not None:
            ids.add(self.model_config.eos_token_id)
        return frozenset(ids)

    def process(self, request_id: str, prompt: str | Seq[int] | dict, params: SamplingParams, *,
                cache_salt: str | None, arrival_time: float, arrival_order: int, priority: int = 0,
                tenant: str | None = None) -> Request:
        """A new request with its first sequence(s); ValueError on bad input."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        text, token_ids, cache_salt = self._parse_prompt(prompt, cache_salt)
        self._validate(token_ids, params)
        eos = frozenset() if params.ignore_eos else self.eos_token_ids
        request = Request(
            request_id, token_ids, params, arrival_time=arrival_time, arrival_order=arrival_order,
            prompt=text, cache_salt=cache_salt, priority=check_int("priority", priority, low=-MAX_PRIORITY,
                                                                   high=MAX_PRIORITY),
            tenant=check_optional_str("tenant", tenant),
            max_len=min(len(token_ids) + params.max_tokens, self.max_model_len),
            stop_token_ids=frozenset(params.stop_token_ids) | eos, eos_token_ids=eos,
            base_seed=int(self._seed_rng.integers(2**31)) if params.seed is None else params.seed)
        # n > 1: one sequence prefills all but the last prompt token, then forks n ways
        width = params.n if not params.use_beam_search else 1
        request.fork_pending = width > 1 and len(token_ids) > 1
        copies = 1 if request.fork_pending else width
        request.seqs = [Sequence(request, list(token_ids), i) for i in range(copies)]
        if params.constrained:
            constraint = self._constraint(params)
            for seq in request.seqs:
                seq.constraint = constraint if seq.index == 0 else constraint.fork()
        if params.prompt_logprobs is not None:
            request.prompt_logprobs = [None]
        if params.bad_words:
            request.bad_words_token_ids = self._bad_words_token_ids(params.bad_words)
        return request

    def _constraint(self, params: SamplingParams):
        """The compiled constraint of a request (ValueError naming what does not compile)."""
        return compile_constraint(params.structured_outputs, params.allowed_token_ids, self.tokenizer,
                                  self.model_config.vocab_size)

    def _bad_words_token_ids(self, words: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """Each bad word's token ids, with and without a leading space (vLLM's rule), deduplicated."""
        ids = {}
        for word in words:
            for text in (word.lstrip(), " " + word.lstrip()):
                tokens = self.tokenizer.encode(text)
                if tokens and tokens[0] == self.tokenizer.bos_token_id:
                    tokens = tokens[1:]  # the tokenizer's post-processor added BOS
                tokens = tuple(tokens)
                if tokens:
                    ids[tokens] = None
        return tuple(ids)

    def validate(self, prompt: str | Seq[int] | dict, params: SamplingParams) -> None:
        """Raise ValueError if `process` would reject this prompt (changes nothing)."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        _, token_ids, _ = self._parse_prompt(prompt, None)
        self._validate(token_ids, params)
        if params.constrained:
            self._constraint(params)

    def _parse_prompt(self, prompt, cache_salt):
        text = None
        if isinstance(prompt, dict):
            cache_salt = prompt.get("cache_salt", cache_salt)
            if "prompt_token_ids" in prompt:
                prompt = prompt["prompt_token_ids"]
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a dict prompt needs 'prompt_token_ids' or 'prompt'")
        check_optional_str("cache_salt", cache_salt)
        if isinstance(prompt, str):
            text, prompt = prompt, self.tokenizer.encode(prompt)  # ValueError without a tokenizer
        return text, self._token_ids(prompt), cache_salt

    def _token_ids(self, values) -> list[int]:
        """The prompt as Python ints; ValueError unless every id is an integer in the vocabulary."""
        if isinstance(values, np.ndarray):
            ids = values
            if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
                raise ValueError(f"prompt token ids must be a flat sequence of integers, "
                                 f"got dtype {ids.dtype} and shape {ids.shape}")
        else:  # any iterable of ids: one C pass that rejects non-integers (2.5, "7", [1])
            if isinstance(values, (bytes, bytearray)):
                raise ValueError("prompt token ids must be integers, not bytes (pass a str to tokenize it)")
            if not isinstance(values, (list, tuple)):
                values = tuple(values)  # a range, a generator: struct.pack needs their length
            try:
                ids = np.frombuffer(struct.pack(f"<{len(values)}q", *values), dtype=np.int64)
            except struct.error as err:
                raise ValueError(f"prompt token ids must be a flat sequence of integers: {err}") from None
        if ids.size == 0:
            return []
        vocab = self.model_config.vocab_size
        if ids.min() < 0 or ids.max() >= vocab:
            bad = ids[(ids < 0) | (ids >= vocab)][0]
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        return ids.tolist()

    def _validate(self, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        total = len(token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt ({len(token_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                             f"exceeds max_model_len ({self.max_model_len})")
        if not self.computes_logits:
            for field, asked in (("prompt_logprobs", params.prompt_logprobs is not None),
                                 ("beam_width", params.beam_width > 1),
                                 ("structured_outputs", params.structured_outputs is not None
                                  and not self.samples_under_token_masks),
                                 ("allowed_token_ids", params.allowed_token_ids is not None
                                  and not self.samples_under_token_masks)):
                if asked:
                    raise ValueError(f"{field} needs a device that computes logits; this engine's simulated "
                                     "device samples a fixed token")
        if self.speculative and params.structured_outputs is not None:
            raise ValueError("structured_outputs is not supported with speculative decoding yet "
                             "(engine built with speculative_config): drop one of them")
        vocab = self.model_config.vocab_size
        if params.top_k > vocab:
            raise ValueError(f"top_k must be -1 or at most the vocabulary size ({vocab}), got {params.top_k}")
        bad_bias = [t for t in (params.logit_bias or ()) if t >= vocab]
        if bad_bias:
            raise ValueError(f"logit_bias token id {bad_bias[0]} is outside the vocabulary [0, {vocab})")
        if params.use_beam_search and pow2_bucket(2 * params.beam_width) > vocab:
            raise ValueError(f"beam_width {params.beam_width} is too large for the vocabulary ({vocab}): "
                             f"at most {max_beam_width(vocab)}")
        needed = max_blocks_needed(len(token_ids), params, max_model_len=self.max_model_len,
                                   block_size=self.block_size, blocks_for_tokens=self.blocks_for_tokens)
        if needed > self.num_blocks:
            raise ValueError(f"request can never fit the KV pool: it may need {needed} blocks of "
                             f"{self.block_size} tokens, the pool has {self.num_blocks}")


def max_beam_width(vocab_size: int) -> int:
    """The widest beam search the device step supports (it brings back 2 x width top log-probs, padded)."""
    return next_power_of_two(vocab_size + 1) // 4


def max_blocks_needed(num_prompt_tokens: int, params: SamplingParams, *, max_model_len: int,
                      block_size: int, blocks_for_tokens: Callable[[int], int] | None = None) -> int:
    """The most KV blocks a request can hold at once, so that admission refuses only what cannot fit.

    A sequence never computes the K/V of its last token (nothing reads it), so
    it holds at most `cdiv(max_len - 1, block_size)` blocks. With n > 1 or beam
    search the prompt's full blocks before its last token are shared and every
    sequence owns the rest (copy-on-write); beam search replaces beams by
    forking, so each beam may briefly hold one more block than its tokens need.
    With `blocks_for_tokens` (KV cache groups) nothing is counted as shared.
    """
    max_len = min(num_prompt_tokens + params.max_tokens, max_model_len)
    per_seq = cdiv(max_len - 1, block_size) if blocks_for_tokens is None else blocks_for_tokens(max_len - 1)
    width = params.beam_width if params.use_beam_search else params.n
    if width == 1:
        return per_seq
    shared = (num_prompt_tokens - 1) // block_size if blocks_for_tokens is None else 0
    extra = 1 if params.use_beam_search else 0
    return shared + width * (per_seq - shared + extra)
