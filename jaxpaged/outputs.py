"""What `generate` and `Engine.step` hand back, shaped like vLLM's RequestOutput."""

from __future__ import annotations

import dataclasses
import enum


class RequestOutputKind(enum.Enum):
    """Which outputs `Engine.step` returns for a request, as vLLM's (`SamplingParams.output_kind`).

    CUMULATIVE: after every step that advanced it, everything generated so far.
    DELTA: after every step that advanced it, only what is new since its last output.
    FINAL_ONLY: one output, when it finishes (what `LLM.generate` uses).
    """

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclasses.dataclass(slots=True)
class CompletionOutput:
    """One generated sequence of a request (with DELTA outputs: its new tokens and text only)."""

    index: int
    token_ids: list[int]
    text: str
    cumulative_logprob: float
    finish_reason: str | None  # "stop", "length" or "abort"; None while it runs
    # with SamplingParams.logprobs: per output token, {token id: logprob} for the sampled and top ids
    logprobs: list[dict[int, float]] | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it, if any
    # the engine core only: each token's logprob when a DELTA output carries several (speculative decoding),
    # so that its API server can take tokens cut after a stop string out of cumulative_logprob
    token_logprobs: list[float] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestMetrics:
    """Per-request timings (time.monotonic seconds) and KV accounting."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_preemptions: int = 0
    peak_blocks_shared: int = 0  # most distinct blocks the request's sequences held at once
    peak_blocks_unshared: int = 0  # the same sequences' block-table entries: what no sharing would cost
    token_times: list[float] = dataclasses.field(default_factory=list)  # arrival of each output token (seq 0)

    @property
    def inter_token_latencies(self) -> list[float]:
        """Gaps between consecutive output tokens (ITL)."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def ttft(self) -> float | None:
        """Time to first token, from arrival."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclasses.dataclass(slots=True)
class RequestOutput:
    """A request's progress after a step; `finished` marks its last output (aborted ones included)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    metrics: RequestMetrics | None  # on the final output; None on the outputs streamed before it
    # SamplingParams.prompt_logprobs: per prompt token {token id: logprob}, the first None (DELTA: the new ones)
    prompt_logprobs: list[dict[int, float] | None] | None = None


def merge_outputs(pending: RequestOutput, new: RequestOutput, kind: RequestOutputKind) -> RequestOutput:
    """One output that says what `pending` and then `new` (both of one request) said, for a reader that
    has not taken `pending` yet (vLLM's `RequestOutputCollector`): a slow client gets one chunk per wake-up.

    CUMULATIVE and FINAL_ONLY outputs already carry everything: `new` replaces `pending`. DELTA outputs are
    concatenated per sequence index (`pending` is extended in place and returned).
    """
    if kind is not RequestOutputKind.DELTA:
        return new
    by_index = {c.index: c for c in pending.outputs}
    for c in new.outputs:
        old = by_index.get(c.index)
        if old is None:
            by_index[c.index] = c
            continue
        old.token_ids = old.token_ids + c.token_ids
        old.text += c.text
        old.cumulative_logprob, old.finish_reason, old.stop_reason = c.cumulative_logprob, c.finish_reason, c.stop_reason
        if c.logprobs is not None:
            old.logprobs = c.logprobs if old.logprobs is None else old.logprobs + c.logprobs
    if len(by_index) != len(pending.outputs):
        pending.outputs = sorted(by_index.values(), key=lambda c: c.index)
    if new.prompt_logprobs is not None:
        pending.prompt_logprobs = (new.prompt_logprobs if pending.prompt_logprobs is None
                                   else pending.prompt_logprobs + new.prompt_logprobs)
    pending.finished, pending.num_cached_tokens, pending.metrics = new.finished, new.num_cached_tokens, new.metrics
    return pending
