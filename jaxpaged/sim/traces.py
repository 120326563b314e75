"""Mooncake-format request traces (FAST'25 release): load them and turn them into token ids.

A trace is JSON lines ``{"timestamp": ms, "input_length": n, "output_length": m,
"hash_ids": [...]}``, where ``hash_ids`` name the prompt's blocks of
``TRACE_BLOCK_SIZE`` (512) tokens as prefix hashes: two requests whose lists
start with the same k ids share their first k * 512 prompt tokens, and the last
block may be partial. :func:`prompt_token_ids` gives each hash id a fixed
pseudo-random block (a SplitMix64 of the id and the position, below
``vocab_size``) and cuts the last block to ``input_length``, so prompts share
exactly the prefixes the trace says they share, at any block size.

``data/traces/mooncake_conversation_trace.jsonl`` ships with the repository
(Apache-2.0, see its README).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from jaxtyping import Int

from jaxpaged.sim.workloads import TOKEN_ID_LIMIT, WorkloadRequest

TRACE_BLOCK_SIZE = 512
CONVERSATION_TRACE = Path(__file__).resolve().parents[2] / "data" / "traces" / "mooncake_conversation_trace.jsonl"


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One trace line: arrival (seconds from the trace's start), lengths and prefix block ids."""

    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _field(record: dict, name: str, where: str, *, low: int = 0) -> int:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
        raise ValueError(f"{where}: {name} must be a number >= {low}, got {value!r}")
    return value


def parse_trace_line(line: str, where: str = "trace") -> TraceRequest:
    """One JSON line as a :class:`TraceRequest`; ValueError naming the field when it is malformed."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not JSON ({err})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a trace line must be a JSON object")
    timestamp = _field(record, "timestamp", where)
    input_length = int(_field(record, "input_length", where, low=1))
    output_length = int(_field(record, "output_length", where))
    hash_ids = record.get("hash_ids")
    if not isinstance(hash_ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                 for h in hash_ids):
        raise ValueError(f"{where}: hash_ids must be a list of non-negative integers")
    expected = -(-input_length // TRACE_BLOCK_SIZE)
    if len(hash_ids) != expected:
        raise ValueError(f"{where}: hash_ids has {len(hash_ids)} blocks, input_length {input_length} needs "
                         f"{expected} of {TRACE_BLOCK_SIZE} tokens")
    return TraceRequest(timestamp / 1000.0, input_length, output_length, tuple(hash_ids))


def load_trace(path: str | Path = CONVERSATION_TRACE, *, limit: int | None = None) -> list[TraceRequest]:
    """The first ``limit`` (default: all) requests of a Mooncake-format trace, in arrival order."""
    requests = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if limit is not None and len(requests) >= limit:
                break
            if line.strip():
                requests.append(parse_trace_line(line, f"{path}:{number}"))
    if any(b.arrival_s < a.arrival_s for a, b in zip(requests, requests[1:])):
        raise ValueError(f"{path}: timestamps must not decrease")
    return requests


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def prompt_token_ids(request: TraceRequest, vocab_size: int = TOKEN_ID_LIMIT) -> Int[np.ndarray, " n"]:
    """The request's prompt: each hash id's fixed block of 512 ids below ``vocab_size``, cut to its length."""
    positions = np.arange(request.input_length, dtype=np.uint64)
    ids = np.asarray(request.hash_ids, dtype=np.uint64)[positions // np.uint64(TRACE_BLOCK_SIZE)]
    with np.errstate(over="ignore"):
        mixed = _splitmix64(ids * np.uint64(TRACE_BLOCK_SIZE) + positions % np.uint64(TRACE_BLOCK_SIZE))
    return (mixed % np.uint64(vocab_size)).astype(np.int64)


def output_token_ids(index: int, request: TraceRequest, vocab_size: int = TOKEN_ID_LIMIT) -> Int[np.ndarray, " m"]:
    """Stand-in generated tokens for request ``index`` (unique to it), for replays that cache decode blocks."""
    positions = np.arange(request.output_length, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = _splitmix64(~np.uint64(index) * np.uint64(1 << 20) + positions)
    return (mixed % np.uint64(vocab_size)).astype(np.int64)


def trace_workload(requests: Sequence[TraceRequest], *, time_scale: float = 1.0, vocab_size: int = TOKEN_ID_LIMIT,
                   max_model_len: int | None = None, name: str = "trace") -> list[WorkloadRequest]:
    """The trace as a workload: token prompts, ``output_length`` tokens each, arrivals at the trace's
    timestamps times ``time_scale`` (0.5 replays the hour in half an hour).

    With ``max_model_len``, a request longer than it keeps its prompt's tail cut off and its output shortened
    so prompt + output fit (prefix sharing is kept: the cut is at the end).
    """
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
    out = []
    for i, r in enumerate(requests):
        prompt, max_tokens = prompt_token_ids(r, vocab_size), max(r.output_length, 1)
        if max_model_len is not None and len(prompt) + max_tokens > max_model_len:
            max_tokens = min(max_tokens, max(max_model_len // 8, 1))
            prompt = prompt[: max_model_len - max_tokens]
        out.append(WorkloadRequest(f"{name}-{i}", prompt.tolist(), max_tokens,
                                   arrival_time=r.arrival_s * time_scale))
    return out
