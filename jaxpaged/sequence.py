"""Requests and their sequences: the explicit host state the scheduler reads and updates.

A request owns one or more sequences. Parallel sampling (`n > 1`) and beam
search start with one sequence that prefills the prompt once; it is then
forked, sharing every block, and the forks diverge with copy-on-write.

With asynchronous scheduling the host schedules step N+1 before it has read
the tokens step N sampled: those tokens are *placeholders* (counted, not yet
known), and a sequence's `num_computed_tokens` already includes the tokens of
steps in flight.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools

from jaxpaged.sampling_params import SamplingParams

_seq_counter = itertools.count()


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass(eq=False, slots=True, weakref_slot=True)
class Sequence:
    """One token stream of a request, and how much of it is computed or being computed."""

    request: "Request"
    token_ids: list[int]  # the tokens the host knows
    index: int  # which of the request's outputs (sample or beam slot)
    seq_id: int = dataclasses.field(default_factory=lambda: next(_seq_counter))
    num_computed_tokens: int = 0  # tokens with K/V in the pool or being written by a step in flight
    num_placeholders: int = 0  # tokens sampled by steps in flight, not yet read by the host
    cumulative_logprob: float = 0.0
    # each output token's log-probability (the engine core sends a multi-token delta's, so that its API
    # server can take the tokens it cuts after a stop string out of the cumulative logprob)
    token_logprobs: list[float] = dataclasses.field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: str | None = None
    # speculative decoding: verify steps in a row that accepted no draft, and decode steps left without drafts
    spec_misses: int = 0
    spec_skip_steps: int = 0
    # beam search: this sequence's top (token, logprob) candidates, waiting for its siblings
    pending_candidates: list[tuple[int, float]] | None = None
    resident: bool = False  # the runner holds a row for it (its block table and sampling settings)
    # SamplingParams.logprobs: per output token, {token id: logprob} (sampled token and top ones)
    logprobs: list[dict[int, float]] | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    # structured output / allowed_token_ids: what it may sample next (jaxpaged.structured.grammar)
    constraint: object = None
    # a proposer that reads hidden states: the target's last-layer hidden state at the row that gave the last token
    last_hidden: object = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.request.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def compute_limit(self) -> int:
        """Tokens this sequence may have computed once the steps scheduled now have run.

        All known and placeholder tokens, except: all but the last prompt token
        while a fork is pending; never the token that ends the sequence by
        length (`max_tokens`, `max_model_len`), whose K/V nothing reads.
        """
        request = self.request
        if request.fork_pending:
            return len(request.prompt_token_ids) - 1
        return min(len(self.token_ids) + self.num_placeholders, request.max_len - 1)

    @property
    def num_schedulable_tokens(self) -> int:
        """Tokens the next step may compute."""
        if self.pending_candidates is not None:
            return 0
        return max(self.compute_limit - self.num_computed_tokens, 0)

    def fork(self, index: int) -> "Sequence":
        """A child with the same tokens and computed state (its blocks are shared by the cache manager)."""
        return Sequence(self.request, list(self.token_ids), index,
                        num_computed_tokens=self.num_computed_tokens,
                        cumulative_logprob=self.cumulative_logprob, token_logprobs=list(self.token_logprobs),
                        status=self.status,
                        logprobs=None if self.logprobs is None else list(self.logprobs),
                        constraint=None if self.constraint is None else self.constraint.fork(),
                        last_hidden=self.last_hidden)


@dataclasses.dataclass(eq=False)
class Request:
    """A user request: prompt, sampling settings, its live and finished sequences, and timings."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    arrival_order: int
    prompt: str | None = None
    cache_salt: str | None = None
    priority: int = 0  # lower runs first under the priority scheduling policy (vLLM's meaning)
    tenant: str | None = None  # who the server authenticated; the fair scheduling policy shares by it
    max_len: int = 0  # the longest a sequence may grow: min(prompt + max_tokens, max_model_len)
    stop_token_ids: frozenset[int] = frozenset()  # a sampled one ends the sequence ("stop")
    eos_token_ids: frozenset[int] = frozenset()  # EOS ids (empty with ignore_eos), for beam scores
    base_seed: int = 0
    seqs: list[Sequence] = dataclasses.field(default_factory=list)  # live (waiting or running)
    finished_seqs: list[Sequence] = dataclasses.field(default_factory=list)
    fork_pending: bool = False  # n > 1 or beam search, before the first fork
    num_cached_tokens: int | None = None  # prompt tokens served from the prefix cache at first admission
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    aborted: bool = False
    peak_blocks_shared: int = 0  # most distinct blocks its sequences held at once
    peak_blocks_unshared: int = 0  # what the same sequences would hold without sharing
    num_preemptions: int = 0
    token_times: list[float] = dataclasses.field(default_factory=list)  # when each output token arrived
    # SamplingParams.prompt_logprobs: per prompt token, {token id: logprob}; the first entry is None
    prompt_logprobs: list[dict[int, float] | None] | None = None
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()  # SamplingParams.bad_words, tokenized

    @property
    def finished(self) -> bool:
        return not self.seqs and self.finish_time is not None

    @property
    def use_beam_search(self) -> bool:
        return self.params.beam_width > 1
