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
