"""What crosses between the API servers and the engine core: msgspec structs, MessagePack over ZeroMQ.

Client -> core: `Hello` (once, with the API server's pid), `Add`, `Abort`,
`Call` (a named utility: reset the prefix cache, metrics text, stall, crash).
Core -> client: `Reply` (to a Hello, Add or Call, by `call_id`), `StepOutputs`
(one per engine step per API server that has requests in it: every request's
new token ids, finish reasons, logprobs, prompt logprobs and cached tokens;
no text) and `Dead`
(the core's loop failed; it exits after sending it).

The per-step structs hold no reference cycles, so they are made with
`gc=False` (as vLLM's `EngineCoreOutput`): the thousands built and decoded
every second are never tracked or traversed by the cyclic garbage collector.
"""

from __future__ import annotations

import msgspec


class Hello(msgspec.Struct, tag=True, array_like=True):
    """An API server introduces itself; the core watches `pid` and aborts its requests when it dies."""

    call_id: int
    pid: int


class Add(msgspec.Struct, tag=True, array_like=True):
    """Add a request (already tokenized; `params` as `params_to_dict` writes them)."""

    call_id: int
    request_id: str
    prompt_token_ids: list[int]
    params: dict
    cache_salt: str | None
    priority: int = 0  # lower first, under the priority scheduling policy
    tenant: str | None = None  # the authenticated tenant, for the fair scheduling policy
    limits: list | None = None  # the tenant's admission limits (`AdmissionLimits.to_wire`)


class Abort(msgspec.Struct, tag=True, array_like=True):
    """Abort requests (unknown or finished ones are ignored)."""

    request_ids: list[str]


class Call(msgspec.Struct, tag=True, array_like=True):
    """A utility call answered by a `Reply`: `reset_prefix_cache`, `metrics`, `stall` (args: seconds), `crash`."""

    call_id: int
    name: str
    args: list = []


class Reply(msgspec.Struct, tag=True, array_like=True):
    """The answer to a Hello, Add or Call: `value`, or the error's type name and message."""

    call_id: int
    value: object = None
    error_type: str | None = None
    error: str | None = None


class SeqDelta(msgspec.Struct, array_like=True, gc=False):
    """One sequence's news in a step: its new token ids (and their logprobs), and its finish if it finished."""

    index: int
    token_ids: list[int]
    cumulative_logprob: float
    finish_reason: str | None
    stop_reason: str | int | None
    logprobs: list[dict[int, float]] | None
    text: str  # empty except for beam search, whose final texts the core decodes
    # each new token's logprob when there are several (speculative decoding): a stop string the API server
    # finds inside the delta cuts the tokens after it out of cumulative_logprob too
    token_logprobs: list[float] | None = None


class Metrics(msgspec.Struct, array_like=True, gc=False):
    """`RequestMetrics` on the wire (on a request's final output)."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_preemptions: int
    peak_blocks_shared: int
    peak_blocks_unshared: int
    token_times: list[float]


class RequestDelta(msgspec.Struct, array_like=True, gc=False):
    """One request's news in a step."""

    request_id: str
    finished: bool
    num_cached_tokens: int
    seqs: list[SeqDelta]
    metrics: Metrics | None
    prompt_logprobs: list[dict[int, float] | None] | None = None  # the new entries (all, on a FINAL_ONLY output)


class StepOutputs(msgspec.Struct, tag=True, array_like=True, gc=False):
    """Every news of one engine step for one API server's requests."""

    outputs: list[RequestDelta]


class Dead(msgspec.Struct, tag=True, array_like=True):
    """The core's loop failed with `reason`; no request can be served any more."""

    reason: str


ToCore = Hello | Add | Abort | Call
FromCore = Reply | StepOutputs | Dead
