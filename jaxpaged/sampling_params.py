"""SamplingParams: how to pick each request's output tokens (vLLM-shaped), validated on creation."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from jaxpaged.outputs import RequestOutputKind
from jaxpaged.validation import INT32_MAX, check_bool, check_float, check_int, check_optional_int

MAX_SEED = 2**64 - 1  # seeds are 64-bit; distinct seeds give distinct sample streams

MAX_LOGPROBS = 20  # the most top log-probabilities a request may ask for per token (vLLM's default cap)


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
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise ValueError(f"stop_token_ids must be a list of token ids, got {values!r}")
    return tuple(check_int("stop_token_ids entry", t, low=0, high=INT32_MAX) for t in values)


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
