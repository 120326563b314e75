"""What one HTTP request may ask of the server, checked before anything is built or queued for it.

An API server builds state per choice (`n` mirrors of the request's
sequences) and per prompt (a tokenization, a stream, an add to the core), so
a request's size is checked first, against limits derived from the engine's
own where it has one:

- `n` and `best_of`: at most `max_num_seqs`, the sequences the engine runs at
  once (one request may take the whole batch, never more);
- prompts in one request: at most `max_prompts_per_request`, by default a
  quarter of the waiting-queue bound (`max_waiting_requests`), so one request
  cannot fill the queue and lock every other client out;
- a token-id prompt: at most `max_model_len` ids, each inside the vocabulary
  (an id of any size is a 400, never an overflow further on);
- stop strings, stop token ids, bad words and logit-bias entries: at most the
  counts and lengths below (the core and the front end look at each of them
  at every step of the request); `allowed_token_ids`: at most the
  vocabulary's size;
- the body as a whole: at most `max_json_values` JSON values, counted on its
  bytes before it is parsed (`BodyLimit`), room for the largest request the
  limits above allow. Parsing and validating a body costs memory per value
  (a Python object each, ~100 bytes), not per byte: 32 MiB of `[[1],[1],...]`
  took 5.7 GB to parse and validate before this bound.

A request over a limit is a `ValueError` whose message starts with the
field's name and says the limit (a 400 over HTTP). Load is not shape: a full
waiting queue is the engine's `QueueFullError` (a 503 with `Retry-After`).
"""

from __future__ import annotations

import dataclasses

from jaxpaged.sampling_params import MAX_LOGIT_BIAS

MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_BAD_WORDS = 1024
MAX_BAD_WORD_CHARS = 1024
JSON_VALUES_SLACK = 16384  # values a body may hold beyond its prompts (the other fields, chat messages' keys)


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """The most one request may ask for (see the module docstring)."""

    max_choices: int  # n and best_of
    max_prompts: int  # prompts in one request
    max_model_len: int  # token ids in one prompt
    vocab_size: int

    @classmethod
    def of(cls, model_info, max_prompts_per_request: int | None = None) -> "RequestLimits":
        """The limits of the engine `model_info` describes; `max_prompts_per_request` None: a quarter of its
        waiting queue (at least 1)."""
        if max_prompts_per_request is None:
            max_prompts_per_request = max(1, model_info.max_waiting_requests // 4)
        return cls(model_info.max_num_seqs, max_prompts_per_request, model_info.max_model_len,
                   model_info.model_config.vocab_size)

    @property
    def max_json_values(self) -> int:
        """The most JSON values a request body may hold: its largest prompts (`max_prompts` of `max_model_len`
        ids), room for as many tokens again in chat messages, and `JSON_VALUES_SLACK` for the other fields."""
        return (self.max_prompts + 4) * (self.max_model_len + 1) + JSON_VALUES_SLACK

    def check_sampling(self, body) -> None:
        """The sampling fields of a completion or chat body (`protocol._SamplingFields`)."""
        _at_most("n", body.n, self.max_choices, "max_num_seqs, the sequences the engine runs at once")
        if body.best_of is not None:  # completions only (chat declares it None)
            _at_most("best_of", body.best_of, self.max_choices, "max_num_seqs, the sequences the engine runs at once")
        stops = [body.stop] if isinstance(body.stop, str) else (body.stop or [])
        _count("stop", stops, MAX_STOP_STRINGS, "strings")
        _each_short("stop", stops, MAX_STOP_STRING_CHARS)
        _count("stop_token_ids", body.stop_token_ids or [], MAX_STOP_TOKEN_IDS, "ids")
        _count("bad_words", body.bad_words or [], MAX_BAD_WORDS, "words")
        _each_short("bad_words", body.bad_words or [], MAX_BAD_WORD_CHARS)
        _count("logit_bias", body.logit_bias or {}, MAX_LOGIT_BIAS, "entries")
        _count("allowed_token_ids", body.allowed_token_ids or [], self.vocab_size, "ids (the vocabulary's size)")

    def check_prompts(self, prompts: list) -> None:
        """The prompts of one request: their number, and each token-id prompt's length and ids."""
        if len(prompts) > self.max_prompts:
            raise ValueError(f"prompt may hold at most {self.max_prompts} prompts per request (a share of the "
                             f"server's waiting queue), got {len(prompts)}")
        for prompt in prompts:
            if not isinstance(prompt, str):
                self.check_token_ids(prompt)

    def check_token_ids(self, prompt: list[int]) -> None:
        """A token-id prompt: at most `max_model_len` ids, each in [0, vocab_size)."""
        if len(prompt) > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) exceeds max_model_len ({self.max_model_len})")
        vocab = self.vocab_size
        for token in prompt:
            if not 0 <= token < vocab:
                raise ValueError(f"prompt token id {token} is outside the vocabulary [0, {vocab})")


def _at_most(name: str, value: int, limit: int, why: str) -> None:
    if value > limit:
        raise ValueError(f"{name} must be at most {limit} ({why}), got {value}")


def _count(name: str, items, limit: int, what: str) -> None:
    if len(items) > limit:
        raise ValueError(f"{name} may have at most {limit} {what}, got {len(items)}")


def _each_short(name: str, texts, limit: int) -> None:
    for text in texts:
        if len(text) > limit:
            raise ValueError(f"{name} strings may be at most {limit} characters long, got one of {len(text)}")
