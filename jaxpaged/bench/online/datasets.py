"""Request sets for the online benchmark (random, prefix repetition, ShareGPT JSON, a jaxpaged workload) and
their arrivals.

Every builder returns `BenchRequest` s, deterministic given the seed; a prompt is token ids or text, and
`with_prompt_format` converts between the two with the served model's tokenizer, re-measuring the length
(decoding random ids and re-encoding the text need not give as many tokens). `arrival_offsets` sends them
as ``vllm bench serve`` does.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from jaxtyping import Float

from jaxpaged.sim.workloads import TOKEN_ID_LIMIT, WorkloadRequest
from jaxpaged.tokenizer import Tokenizer, load_tokenizer

PROMPT_FORMATS = ("tokens", "text")
# vLLM's ShareGPT filter: drop conversations shorter than this on either side
SHAREGPT_MIN_LEN = 4


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    """One request to send: its ``prompt`` (token ids or text) is ``prompt_len`` tokens by the served model's
    tokenizer, and it generates ``output_len`` (``max_tokens``); ``cache_salt`` isolates its prefix cache."""

    request_id: str
    prompt: str | list[int]
    prompt_len: int
    output_len: int
    cache_salt: str | None = None


def load_bench_tokenizer(name_or_dir: str) -> Tokenizer:
    """The tokenizer a server of ``name_or_dir`` (a shipped config name, a checkpoint directory or a GGUF
    file) uses: the engine's own choice."""
    from jaxpaged.checkpoint import model_config
    return load_tokenizer(name_or_dir, model_config(name_or_dir))


def _check_positive(**lengths: int) -> None:
    """ValueError naming the first of ``lengths`` under 1."""
    for name, value in lengths.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def _tokens(rng: np.random.Generator, n: int, vocab_limit: int) -> list[int]:
    return rng.integers(0, vocab_limit, size=n).tolist()


def random_requests(num_requests: int, *, input_len: int, output_len: int, range_ratio: float = 0.0,
                    seed: int = 0, vocab_limit: int = TOKEN_ID_LIMIT, name: str = "random") -> list[BenchRequest]:
    """``num_requests`` random token prompts ``name-<i>``; lengths uniform in ``[len * (1 - r), len * (1 + r)]``,
    at least 1 (``vllm bench serve --dataset-name random``)."""
    _check_positive(input_len=input_len, output_len=output_len, vocab_limit=vocab_limit)
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)

    def length(mean: int) -> int:
        low, high = max(1, int(mean * (1 - range_ratio))), int(mean * (1 + range_ratio))
        return int(rng.integers(low, max(low, high) + 1))

    requests = []
    for i in range(num_requests):
        prompt = _tokens(rng, length(input_len), vocab_limit)
        requests.append(BenchRequest(f"{name}-{i}", prompt, len(prompt), length(output_len)))
    return requests


def prefix_repetition_requests(num_requests: int, *, prefix_len: int, suffix_len: int, num_prefixes: int,
                               output_len: int, seed: int = 0,
                               vocab_limit: int = TOKEN_ID_LIMIT) -> list[BenchRequest]:
    """``num_requests`` prompts, each one of ``num_prefixes`` shared prefixes (round robin) plus a unique suffix,
    shuffled: the shape that exercises the prefix cache."""
    _check_positive(prefix_len=prefix_len, suffix_len=suffix_len, num_prefixes=num_prefixes,
                    output_len=output_len, vocab_limit=vocab_limit)
    rng = np.random.default_rng(seed)
    prefixes = [_tokens(rng, prefix_len, vocab_limit) for _ in range(num_prefixes)]
    prompts = [prefixes[i % num_prefixes] + _tokens(rng, suffix_len, vocab_limit) for i in range(num_requests)]
    order = rng.permutation(num_requests)
    return [BenchRequest(f"prefix-{i}", prompts[j], prefix_len + suffix_len, output_len)
            for i, j in enumerate(order)]


def _measure(value: str | list, tokenizer: Tokenizer | None, what: str) -> int:
    if isinstance(value, list):
        if not all(isinstance(t, int) for t in value):
            raise ValueError(f"{what}: a token-id list must hold only integers")
        return len(value)
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected text or a list of token ids, got {type(value).__name__}")
    if tokenizer is None:
        raise ValueError(f"{what} is text: a tokenizer is needed to count its tokens")
    return len(tokenizer.encode(value))


def sharegpt_requests(path: str | Path, num_requests: int, *, tokenizer: Tokenizer | None, seed: int = 0,
                      output_len: int | None = None, max_prompt_len: int = 1024,
                      max_total_len: int = 2048) -> list[BenchRequest]:
    """``num_requests`` first turns of a ShareGPT-format JSON file, sampled (shuffled by ``seed``).

    The file is a list of ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}, ...]}``;
    a ``value`` is text or a list of token ids. Skipped, as vLLM skips them: conversations of fewer than two
    turns, a prompt or reply under 4 tokens, a prompt over ``max_prompt_len``, prompt plus output over
    ``max_total_len``. The output length is the reply's, or ``output_len``. ValueError when fewer usable
    conversations remain than asked.
    """
    entries = json.loads(Path(path).read_text())
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a JSON list of conversations, got {type(entries).__name__}")
    if output_len is not None:
        _check_positive(output_len=output_len)
    order = np.random.default_rng(seed).permutation(len(entries))
    requests = []
    for index in order:
        if len(requests) == num_requests:
            break
        entry = entries[index]
        turns = entry.get("conversations", entry.get("conversation")) if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        prompt = turns[0].get("value")
        what = f"{path} entry {index}"
        prompt_len = _measure(prompt, tokenizer, f"{what} prompt")
        reply_len = _measure(turns[1].get("value"), tokenizer, f"{what} reply")
        wanted = reply_len if output_len is None else output_len
        too_short = prompt_len < SHAREGPT_MIN_LEN or (output_len is None and reply_len < SHAREGPT_MIN_LEN)
        if too_short or prompt_len > max_prompt_len or prompt_len + wanted > max_total_len:
            continue
        requests.append(BenchRequest(f"sharegpt-{index}", prompt, prompt_len, wanted))
    if len(requests) < num_requests:
        raise ValueError(f"{path}: only {len(requests)} usable conversations for {num_requests} requests "
                         f"(prompt 4-{max_prompt_len} tokens, prompt + output <= {max_total_len})")
    return requests


def from_workload(requests: Sequence[WorkloadRequest]) -> list[BenchRequest]:
    """A jaxpaged workload's requests as bench requests (token prompts, cache salts kept); not a multiturn one:
    a later turn's prompt holds the earlier turns' generated tokens, which a stream does not return as ids."""
    if any(r.conversation_id is not None for r in requests):
        raise ValueError("multiturn workloads need each turn's generated token ids; "
                         "the online benchmark sends single-turn workloads only")
    return [BenchRequest(r.request_id, list(r.prompt_token_ids), len(r.prompt_token_ids), r.max_tokens,
                         r.cache_salt) for r in requests]


def with_prompt_format(requests: Sequence[BenchRequest], prompt_format: str,
                       tokenizer: Tokenizer | None) -> list[BenchRequest]:
    """``requests`` with every prompt as ``"tokens"`` or ``"text"``, lengths re-measured by ``tokenizer``."""
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"unknown prompt_format {prompt_format!r}; choose from {', '.join(PROMPT_FORMATS)}")
    wants_text = prompt_format == "text"
    converted = []
    for r in requests:
        if isinstance(r.prompt, str) == wants_text:
            converted.append(r)
            continue
        if tokenizer is None:
            raise ValueError(f"converting prompts to {prompt_format} needs a tokenizer")
        if wants_text:
            text = tokenizer.decode(r.prompt)
            converted.append(dataclasses.replace(r, prompt=text, prompt_len=len(tokenizer.encode(text))))
        else:
            ids = tokenizer.encode(r.prompt)
            converted.append(dataclasses.replace(r, prompt=ids, prompt_len=len(ids)))
    return converted


def arrival_offsets(num_requests: int, request_rate: float, *, burstiness: float = 1.0,
                    seed: int = 0) -> Float[np.ndarray, " n"]:
    """Seconds from the start at which each of ``num_requests`` requests is sent (non-decreasing).

    The first goes at 0, each later one a gamma-distributed gap (shape ``burstiness``, mean ``1 / request_rate``)
    after the one before, as ``vllm bench serve`` sends them: ``burstiness == 1`` is a Poisson process, smaller
    is burstier (squared coefficient of variation ``1 / burstiness``). A rate of 0 or infinity: all at once.
    """
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if not request_rate >= 0:  # also rejects NaN
        raise ValueError(f"request_rate must be >= 0 (0 or inf = all at once), got {request_rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a positive finite number, got {burstiness}")
    if request_rate == 0 or math.isinf(request_rate):
        return np.zeros(num_requests)
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness),
                                             size=max(num_requests - 1, 0))
    return np.concatenate([np.zeros(min(num_requests, 1)), np.cumsum(gaps)])
