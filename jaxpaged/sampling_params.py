"""SamplingParams: how to pick each request's output tokens (vLLM-shaped), validated on creation."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Sequence

from jaxpaged.outputs import RequestOutputKind
from jaxpaged.structured.params import StructuredOutputsParams
from jaxpaged.validation import INT32_MAX, check_bool, check_float, check_int, check_optional_int

MAX_SEED = 2**64 - 1  # seeds are 64-bit; distinct seeds give distinct sample streams

MAX_LOGPROBS = 20  # the most top log-probabilities a request may ask for per token (vLLM's default cap)
MAX_LOGIT_BIAS = 1024  # the most `logit_bias` entries one request may give
MAX_LOGIT_BIAS_VALUE = 100.0  # |bias| at most this (OpenAI's range)
MAX_KV_SOURCE_CHARS = 256  # a KV endpoint (tcp://host:port) is far shorter


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, checked on construction (ValueError naming the field).

    Integers must be ints (not bools), floats finite; `seed` is a 64-bit
    unsigned integer or None (a random one per request).

    `temperature=0` is greedy. `top_k=-1` and `top_p=1` disable those filters.
    `n > 1` samples n sequences from one prefilled prompt (blocks shared,
    copy-on-write). `beam_width > 1` runs beam search instead of sampling and
    returns the `beam_width` best beams, scored by `cumulative_logprob / len ** length_penalty`.
    `detokenize=False` leaves each output's `text` empty (token ids only), as in vLLM.
    `stop` strings end a sequence when its detokenized text contains one; the
    text is cut before it (`include_stop_str_in_output` keeps it) and, while
    streaming, the last `len(longest stop) - 1` characters are held back so a
    stop string never leaks out in part. `logprobs=k` returns, for every output
    token, the log-probabilities (under the raw logits) of the sampled token
    and of the k most likely ones; 0 returns the sampled token's alone.
    `output_kind` chooses what `Engine.step` streams back for the request:
    everything so far after every step (CUMULATIVE, the default), only what is
    new (DELTA), or one output at the end (FINAL_ONLY). Beam search returns its
    beams only at the end, whatever the kind.

    `prompt_logprobs=k` returns, for every prompt token after the first, its
    log-probability given the tokens before it and the k most likely ones
    (vLLM's meaning; the first entry is None). Such a request computes its
    whole prompt: it looks up no prefix-cache hit (a cached block has no logits).

    Logit controls, applied to the logits the token is chosen from (the
    returned logprobs stay those of the raw logits), in vLLM's order:
    `logit_bias` adds a bias (in [-100, 100]) to the given token ids;
    `min_tokens` masks the stop ids and EOS (and defers stop strings) until
    that many tokens are out; then `repetition_penalty` (> 0; 1 = off) divides
    positive and multiplies negative logits of every token seen in the prompt
    or the output, `frequency_penalty` (in [-2, 2]) subtracts itself once per
    occurrence of a token in the output, and `presence_penalty` (in [-2, 2])
    once per token present in the output. `bad_words` (strings, tokenized with
    and without a leading space, as vLLM) never appear in the output: a word's
    last token is masked whenever the output ends with the rest of it.

    Constraints: `structured_outputs` (a `StructuredOutputsParams`: JSON
    schema, JSON object, regex, choice or grammar) restricts every sampled
    token to those that keep the output a valid prefix, and EOS to where it is
    complete; `allowed_token_ids` restricts sampling to those ids; `min_p`
    (in [0, 1]) drops tokens whose probability is below `min_p` times the most
    likely one's (after temperature). A constraint that does not compile is a
    ValueError when the request is added.

    `kv_source` (disaggregated prefill and decode; vLLM carries it in
    `kv_transfer_params`): the KV endpoint (`tcp://host:port`) of the engine
    that prefilled this prompt. A decode engine pulls the prompt's blocks from
    that engine alone when it is one of its `kv_peers`, and from every peer in
    turn otherwise. It changes no token.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    beam_width: int = 1
    length_penalty: float = 1.0
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    stop: Sequence[str] = ()
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = dataclasses.field(default=None, hash=False)
    min_tokens: int = 0
    bad_words: Sequence[str] = ()
    min_p: float = 0.0
    allowed_token_ids: Sequence[int] | None = None
    structured_outputs: StructuredOutputsParams | None = dataclasses.field(default=None, hash=False)
    kv_source: str | None = None

    def __post_init__(self):
        """Check every field's type and range (ValueError naming the field); store them normalised."""
        fields = {
            "n": check_int("n", self.n, low=1, high=INT32_MAX),
            "temperature": check_float("temperature", self.temperature, low=0.0),
            "top_k": check_int("top_k", self.top_k, low=-1, high=INT32_MAX),
            "top_p": check_float("top_p", self.top_p, low=0.0, low_open=True, high=1.0),
            "seed": check_optional_int("seed", self.seed, low=0, high=MAX_SEED),
            "max_tokens": check_int("max_tokens", self.max_tokens, low=1, high=INT32_MAX),
            "stop_token_ids": _stop_token_ids(self.stop_token_ids),
            "ignore_eos": check_bool("ignore_eos", self.ignore_eos),
            "beam_width": check_int("beam_width", self.beam_width, low=1, high=INT32_MAX),
            "length_penalty": check_float("length_penalty", self.length_penalty),
            "detokenize": check_bool("detokenize", self.detokenize),
        }
        if fields["top_k"] == 0:
            raise ValueError("top_k must be -1 (disabled) or at least 1, got 0")
        if fields["beam_width"] > 1 and fields["n"] > 1:
            raise ValueError("beam search returns beam_width beams; set n=1 with beam_width > 1")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        self._check_stop_strings_and_logprobs()
        self._check_logit_controls()
        self._check_constraints()

    def _check_constraints(self) -> None:
        object.__setattr__(self, "min_p", check_float("min_p", self.min_p, low=0.0, high=1.0))
        if self.kv_source is not None and (not isinstance(self.kv_source, str)
                                           or not 0 < len(self.kv_source) <= MAX_KV_SOURCE_CHARS):
            raise ValueError(f"kv_source must be an endpoint string of 1 to {MAX_KV_SOURCE_CHARS} characters, "
                             f"got {self.kv_source!r:.80}")
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if isinstance(ids, (str, bytes, dict)) or not isinstance(ids, Iterable):
                raise ValueError(f"allowed_token_ids must be a list of token ids, got {ids!r}")
            ids = tuple(check_int("allowed_token_ids entry", t, low=0, high=INT32_MAX) for t in ids)
            if not ids:
                raise ValueError("allowed_token_ids must list at least one token id")
            object.__setattr__(self, "allowed_token_ids", ids)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams, got "
                             f"{type(self.structured_outputs).__name__}")
        if self.beam_width > 1 and (self.structured_outputs is not None or self.allowed_token_ids is not None
                                    or self.min_p):
            raise ValueError("structured_outputs, allowed_token_ids and min_p are not supported with beam search "
                             "(beam_width > 1)")

    @property
    def constrained(self) -> bool:
        """Whether sampling is restricted by a token mask (structured output or allowed_token_ids)."""
        return self.structured_outputs is not None or self.allowed_token_ids is not None

    def _check_logit_controls(self) -> None:
        fields = {
            "presence_penalty": check_float("presence_penalty", self.presence_penalty, low=-2.0, high=2.0),
            "frequency_penalty": check_float("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0),
            "repetition_penalty": check_float("repetition_penalty", self.repetition_penalty, low=0.0,
                                              low_open=True),
            "min_tokens": check_int("min_tokens", self.min_tokens, low=0, high=self.max_tokens),
            "logit_bias": _logit_bias(self.logit_bias),
            "bad_words": _bad_words(self.bad_words),
        }
        if self.prompt_logprobs is not None:
            check_int("prompt_logprobs", self.prompt_logprobs, low=0, high=MAX_LOGPROBS)
        if self.beam_width > 1 and (fields["presence_penalty"] or fields["frequency_penalty"]
                                    or fields["repetition_penalty"] != 1.0 or fields["logit_bias"]
                                    or fields["min_tokens"] or fields["bad_words"]):
            raise ValueError("penalties, logit_bias, min_tokens and bad_words are not supported with beam search "
                             "(beam_width > 1)")
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    @property
    def uses_penalties(self) -> bool:
        """Whether the sampler needs this request's prompt and output tokens."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    def _check_stop_strings_and_logprobs(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)):
            raise ValueError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
        for s in stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must be a list of non-empty strings, got {s!r}")
        object.__setattr__(self, "stop", tuple(stop))
        check_bool("include_stop_str_in_output", self.include_stop_str_in_output)
        if stop and self.beam_width > 1:
            raise ValueError("stop strings are not supported with beam search (beam_width > 1)")
        if self.logprobs is not None:
            check_int("logprobs", self.logprobs, low=0, high=MAX_LOGPROBS)
            if self.beam_width > 1:
                raise ValueError("logprobs is not supported with beam search (beam_width > 1)")

    @property
    def use_beam_search(self) -> bool:
        return self.beam_width > 1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _stop_token_ids(values) -> tuple[int, ...]:
    """The stop ids as a tuple of ints; ValueError unless a list/tuple of non-negative integers."""
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Iterable):
        raise ValueError(f"stop_token_ids must be a list of token ids, got {values!r}")
    return tuple(check_int("stop_token_ids entry", t, low=0, high=INT32_MAX) for t in values)


def _logit_bias(bias) -> dict[int, float] | None:
    """`logit_bias` as {token id: float}; ValueError naming the field on a bad id, value or size.

    Keys may be ints or decimal strings (JSON object keys are strings).
    The ids are checked against the vocabulary when the request is added.
    """
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be a mapping of token id to bias, got {type(bias).__name__}")
    if len(bias) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias may have at most {MAX_LOGIT_BIAS} entries, got {len(bias)}")
    out = {}
    for key, value in bias.items():
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            key = int(key)
        token = check_int("logit_bias token id", key, low=0, high=INT32_MAX)
        out[token] = check_float(f"logit_bias (token {token})", value, low=-MAX_LOGIT_BIAS_VALUE,
                                 high=MAX_LOGIT_BIAS_VALUE)
    return out or None


def _bad_words(words) -> tuple[str, ...]:
    if isinstance(words, str) or not isinstance(words, (list, tuple)):
        raise ValueError(f"bad_words must be a list of strings, got {words!r}")
    for w in words:
        if not isinstance(w, str) or not w.strip():
            raise ValueError(f"bad_words must be a list of non-blank strings, got {w!r}")
    return tuple(words)


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's finaliser: a bijection on 64-bit integers with good avalanche."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sequence_seed(request_seed: int, index: int) -> int:
    """The 32-bit device seed of output `index` of a request seeded with 64-bit `request_seed`.

    Every bit of the request seed reaches the result (seeds 0 and 2**32 differ),
    and the request's outputs get distinct streams.
    """
    mixed = _splitmix64(_splitmix64(request_seed & _MASK64) ^ index)
    return (mixed ^ (mixed >> 32)) & 0xFFFFFFFF
